"""What the site sees of each node's boot: timelines, their causes, and the kept consoles."""
