"""The API's shapes: items, the Response and its events, client events, and the checked parsing
of a request into them. Nothing here does I/O or keeps state between requests."""
