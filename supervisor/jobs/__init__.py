"""The jobs domain: the Supervisor owns the runners and every verb on them."""
