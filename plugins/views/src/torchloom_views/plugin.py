"""Hook implementations of the views plugin."""

from torchloom.api import hookimpl


@hookimpl
def torchloom_passes():
    from torchloom_views.alias_to_copy import AliasToCopy
    from torchloom_views.collapse import CollapseViews
    from torchloom_views.copy_to_alias import CopyToAlias
    from torchloom_views.strip_bookends import StripBookendViews
    return [StripBookendViews, CollapseViews, AliasToCopy, CopyToAlias]
