"""``sordino stress-test``'s engine: profiles, an open-loop sender, HDR results, findings.

It speaks KServe v2 over HTTP only, never imports the server, and so works against
any implementation of the protocol (sordino, Triton, KServe).
"""
