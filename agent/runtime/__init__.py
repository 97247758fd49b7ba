"""The runtime every role shares: admission, lanes, the journal, progress streams."""
