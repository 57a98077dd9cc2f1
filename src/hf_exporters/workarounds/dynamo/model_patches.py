"""DynamoExporter Stage 2: model patches (``register_patch("dynamo", ...)``)."""

from __future__ import annotations
