"""The `headrace` command. Each part adds its commands in its own module here (see main.py)."""
