"""This machine as a host."""
