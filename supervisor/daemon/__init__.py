"""The daemon process: its lifecycle, its control API and its web page."""
