"""flare-diag: audited diagnostic windows on a live LLM serving host.

The repository keeps the design card's layers as top-level folders (`policies/`, `events/`,
`daemon/`, `fixtures/`); they are installed as `flare_diag.policies`, `flare_diag.events`,
`flare_diag.daemon` and `flare_diag.fixtures`, so that no other distribution's `daemon` or
`fixtures` can overwrite them (pyproject.toml maps the folders with setuptools' package-dir).
"""
