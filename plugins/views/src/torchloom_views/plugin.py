"""Hook implementations of the views plugin."""

from torchloom.api import hookimpl


@hookimpl
def torchloom_passes():
    from torchloom_views.collapse import CollapseViews
    from torchloom_views.strip_bookends import StripBookendViews
    return [StripBookendViews, CollapseViews]
