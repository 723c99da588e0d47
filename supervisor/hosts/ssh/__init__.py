"""A box reached over SSH, through a multiplexed agent."""
