"""Models, prepared once per study (models.smk): from the hub, a GGUF inside a pip package,
or a tiny random model of a real architecture (`prepare`); their sizes (`size`); hub ids and
revisions checked before any job (`hub`)."""
