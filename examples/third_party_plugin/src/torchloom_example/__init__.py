"""An example third-party torchloom plugin (see docs/writing-a-plugin.md)."""
