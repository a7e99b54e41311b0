"""The HTML pages of `pid view` (cli/view.py): a job's page (job.py), a batch's index and pages (batch.py), built
from the blocks in blocks.py (escaping, clipping, diffs, the page shell and its Content-Security-Policy) and the
strict Markdown subset of the assistant's text (markdown.py). Only the CLI shows pages, so they live with it.
"""
