"""Telling people: alerts, what each says, and the secrets kept out of them."""
