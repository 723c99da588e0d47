"""What a job is: its spec, the fields a user may set, pipeline files."""
