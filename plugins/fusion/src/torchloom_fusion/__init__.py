"""torchloom-fusion: the nvFuser-style graph fuser rebuilt as torchloom passes.

Passes: ``fusion.decompose``, ``fusion.functionalize``, ``fusion.vertical``,
``fusion.horizontal`` and ``fusion.merge-groups``. Shared machinery: :mod:`.fusibility`
(what may join a group) and :mod:`.groups` (building and merging group regions).
"""
