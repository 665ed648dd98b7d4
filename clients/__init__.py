"""Edge-side Flower clients, one per method (thin glue over fedapp's core).

Import a method's client from its own module (``fedapp.clients.fedavg``); this package
does not import them all, so a device loads only what its method needs.
"""
