"""Choices that several layers check, written once."""

#: How panels are drawn: `progress=` of `notebook_launcher` and `fine_tune`.
PROGRESS_MODES = ("auto", "widgets", "html", "console", "none")
