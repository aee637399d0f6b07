"""Static-metadata diagnostics: aux_data checks (``aux``), ``fastree.audit`` (``audit``) and
``structure_diff`` / retrace explanations (``diff``). Internal: the public names are
re-exported by ``fastree``.
"""
