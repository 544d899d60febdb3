"""The HTTP transport in front of the app: connection deadlines and request-head limits
(``protocol``), the body limit and security headers (``guard``, ``headers``)."""
