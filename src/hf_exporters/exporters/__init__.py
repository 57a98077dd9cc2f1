"""The exporters, one module each; `result.py` (ExportResult) and `capture.py` (the capture strategies) beside them."""
