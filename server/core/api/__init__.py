"""The server's side of the API: the checked parsing of a request and its items into the shared
types (``bidi_responses.schema``), client events, tools, errors and ids. Nothing here does I/O or
keeps state between requests."""
