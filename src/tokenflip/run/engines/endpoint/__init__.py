"""A live OpenAI-compatible endpoint as an engine: the HTTP client under load (`client`),
what its answers hold (`responses`), what the server is (`server`), and the engine
(`engine`) on the registry's contract."""
