"""The local OpenAI-compatible server: every base and variant by name, over the engine
client and the typed messages."""
