"""The control plane: what runs at synth time and on a laptop, never in an image.

`request` builds the one CreateTrainingJob request (the seam with the image, with `lm.spec`);
`planner` the memory, time and cost of a run; `rules` the deployment's input policy; `prices`
and `containers` (the serving containers: TGI, LMI) their tables. Imports `lm.spec` only.
"""
