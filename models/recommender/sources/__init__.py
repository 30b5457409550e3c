"""Candidate sources of stage one: each fits on a History and returns per user its top-N unseen items."""
