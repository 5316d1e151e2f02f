"""Pipelines shipped with torchloom, selectable by name (the file stem)."""
