"""The domain core: identifiers, states, markers and mention parsing. No I/O here."""
