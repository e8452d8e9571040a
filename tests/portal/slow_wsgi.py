"""The portal's WSGI application behind one slow address, `/slow/?SECONDS`, which waits that long and then
answers as /healthz: a request still in flight when the web process is told to stop."""

import time

from portal.wsgi import application


def app(environ, start_response):
    if environ.get("PATH_INFO") == "/slow/":
        time.sleep(float(environ.get("QUERY_STRING") or "1"))
        environ = {**environ, "PATH_INFO": "/healthz", "QUERY_STRING": ""}
    return application(environ, start_response)
