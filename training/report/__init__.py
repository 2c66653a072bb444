"""The run report: one self-contained HTML file that a user can open, mail or archive."""
