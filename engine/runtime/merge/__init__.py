"""Merging a variant into a standalone model: the room that runs it.

- `job`: the client side (`variant-studio merge`, the OVMS export): verify, run the
  worker, judge survival, add the record;
- `work`: the merge worker process (a worker of `runtime.service`): the merge written
  and quantized, and the survival check run;
- `check`: the survival check, on the engine's scoring (`runtime.scoring`);
- `eval_sets`: what a check is measured on, as the engine's score items;
- `records`: what a merge starts from and the catalog record it adds.

Elsewhere, each where its layer puts it: the arithmetic (`formats.merge`: folding,
grids, the weight and survival figures), reading a merged model's record for `show`,
`list` and `doctor` (`catalog.merged`: the catalog reads it, and the catalog sits below
this room), and choosing a variant's evaluation set (`training.merge_eval`: it reads
score sets through the training data's parser and the demo's held-out file, which sit
above this room).
"""
