"""Entry point of the ``torchloom-fusion`` distribution."""

from __future__ import annotations

from torchloom.api import hookimpl


@hookimpl
def torchloom_passes():
    from torchloom_fusion.combine import CombineGroups
    from torchloom_fusion.decompose import Decompose
    from torchloom_fusion.functionalize import Functionalize
    from torchloom_fusion.horizontal import HorizontalFusion
    from torchloom_fusion.merge_groups import MergeGroups
    from torchloom_fusion.size_carriers import SizeCarriers
    from torchloom_fusion.vertical import VerticalFusion
    return [Decompose, Functionalize, VerticalFusion, HorizontalFusion, MergeGroups,
            CombineGroups, SizeCarriers]
