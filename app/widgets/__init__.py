"""Reusable widgets: cards, stat tiles, live charts and the RunConfig form."""
