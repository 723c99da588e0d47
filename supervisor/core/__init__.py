"""The vocabulary every layer speaks: events, errors, the API's messages, records, settings."""
