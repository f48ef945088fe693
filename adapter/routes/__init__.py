"""The adapter's HTTP routes, one router per concern (assembled by :func:`adapter.app.create_app`).

============================  ==============================================================
:mod:`.chat`                  OpenAI routes: chat completions (untracked and ``/t/<id>/``),
                              models
:mod:`.trajectories`          open, close, read (JSON and the ``/raw`` entries)
:mod:`.admin`                 weight refreshes (disk and distributed), versions
:mod:`.health`                ``/health``, ``/metrics``
:mod:`.deps`                  injected dependencies (the service, credentials) and body reading
============================  ==============================================================
"""
