"""The command line (`tokenflip`): `main` dispatches the commands, `args` declares their
arguments, `audit` and `gate` are the two commands that judge a deployment."""
