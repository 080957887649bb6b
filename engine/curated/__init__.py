"""What the app ships and sets up itself: the embedded base model, the demo variant and
the curated OpenVINO default built from the embedded model."""
