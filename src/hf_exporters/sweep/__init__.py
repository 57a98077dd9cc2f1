"""``hf-exporters sweep``: export every model class of the installed transformers through every backend.

Modules: :mod:`.classes` (which classes), :mod:`.tiny` (tiny configs), :mod:`.inputs` (example inputs),
:mod:`.job` (one job and the classification of its failure), :mod:`.runner` (isolated processes, pool,
resume, Ray), :mod:`.report` (summary.json, report.md, chart), :mod:`.smoke` (the CI smoke set and baseline).
"""
