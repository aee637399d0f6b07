"""The exception every part of the suite raises to skip something with a note instead of failing."""


class Unsupported(Exception):
    """A library, tree, leaf kind or op that cannot run here; the message becomes the note."""
