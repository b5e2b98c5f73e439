"""The live web view (``--web-view``): the cluster as the scheduler sees it, read-only.

``state`` (pure: snapshot and gangs in, the page's document out), ``feed`` (what the loop and
the reporter hand over, held between them and the page), ``server`` (aiohttp: the page from
``static/``, ``/state``, ``/events``; every write is 405). See docs/web-view.md.
"""
