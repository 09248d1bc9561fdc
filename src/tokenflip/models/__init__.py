"""Models, prepared once per study (models.smk): from the hub, a GGUF inside a pip package,
or a tiny random model of a real architecture (`prepare`); their sizes (`size`); hub ids and
revisions checked before any job (`hub`)."""


class ModelError(RuntimeError):
    """A model that cannot be prepared or loaded as its entry says (here, not in `prepare`,
    so that catching it imports no torch)."""
