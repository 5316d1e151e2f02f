"""torchloom-views: views at fusion-group edges move out of the kernel; view chains collapse."""
