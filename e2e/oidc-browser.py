#!/usr/bin/env python3
"""A scripted browser for a route behind an AuthPolicy `oidc` method and the OpenID Provider of
e2e/oidc-provider.sh (zitadel/oidc's example OP: its login form and test users).

  oidc-browser.py session URL
      logs in at URL (a page of the route) and prints the session cookie, `tollgate_session=...`
      (with its chunks `tollgate_session_N=...` when it has any, `; `-separated: a Cookie
      header's value; e2e/bench/oidc.sh sends it with every request).
  oidc-browser.py example URL ISSUER
      the login examples/oidc/README.md promises, through the Gateway at URL with the provider
      at ISSUER, each step checked (e2e/examples-test.sh): an API client without a session gets
      401; a page load is redirected to ISSUER's authorization endpoint (code flow with PKCE,
      the callback on URL's origin); the provider's login form; the callback sets the session
      cookie and sends the browser back to the page, which the backend serves with
      `x-user: id1` (the ID token's `sub`); a tampered cookie gets 401; /logout clears the
      cookie, ends the session at the provider, which sends the browser back to the site, and
      from there to the login form again.

Prints `ok: ...` for each step to stderr; exits 1 at the first step that fails (with what was
answered). The cookie jar keeps cookies per host (not port, as browsers do) and path, drops a
`Max-Age=0` one, and sends `Secure` cookies over plain HTTP too: the tests serve the route on
loopback addresses without TLS, where a browser keeps them for `localhost` only
(docs/policies.md).
"""

import http.client
import json
import sys
import urllib.parse

# The provider's first test user, `test-user@<the issuer's host>`, and its `sub`.
PASSWORD, USER_SUB = "verysecure", "id1"
COOKIE = "tollgate_session"


class Fail(Exception):
    pass


def check(cond, what, got=""):
    if not cond:
        raise Fail(f"{what}; got: {str(got)[:600]}")


class Answer:
    def __init__(self, url, status, headers, body):
        self.url, self.status, self.headers, self.body = url, status, headers, body

    def header(self, name):
        return next((v for k, v in self.headers if k.lower() == name), None)

    def location(self):
        loc = self.header("location")
        check(loc, f"{self.url}: {self.status} without a Location", self.body)
        return urllib.parse.urljoin(self.url, loc)

    def __str__(self):
        return f"{self.status} from {self.url}: {self.headers} {self.body[:300]}"


class Browser:
    def __init__(self):
        self.jar = {}  # (host, path, name) -> value

    def cookies(self, url):
        u = urllib.parse.urlsplit(url)
        path = u.path or "/"
        return {n: v for (h, p, n), v in self.jar.items() if h == u.hostname and path.startswith(p)}

    def store(self, url, set_cookie):
        u = urllib.parse.urlsplit(url)
        parts = [p.strip() for p in set_cookie.split(";")]
        name, value = parts[0].split("=", 1)
        attrs = dict((p.split("=", 1) + [""])[:2] for p in parts[1:])
        attrs = {k.lower(): v for k, v in attrs.items()}
        key = (u.hostname, attrs.get("path", "/"), name)
        if attrs.get("max-age") == "0":
            self.jar.pop(key, None)
        else:
            self.jar[key] = value

    def request(self, method, url, body=None, accept="text/html", cookies=None):
        u = urllib.parse.urlsplit(url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
        headers = {"Accept": accept}
        sent = self.cookies(url) if cookies is None else cookies
        if sent:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in sent.items())
        if body is not None:
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        conn.request(method, u.path + (f"?{u.query}" if u.query else "") or "/", body=body, headers=headers)
        r = conn.getresponse()
        a = Answer(url, r.status, r.getheaders(), r.read().decode("utf-8", "replace"))
        conn.close()
        for k, v in a.headers:
            if k.lower() == "set-cookie":
                self.store(url, v)
        return a

    def follow(self, url, stop=lambda url: False):
        """GET url and the redirects after it, until an answer that is not one or a URL `stop`
        takes (not requested); the visited URLs and the last answer."""
        visited = []
        for _ in range(10):
            a = self.request("GET", url)
            visited.append(url)
            if a.status not in (301, 302, 303, 307):
                return visited, a
            url = a.location()
            if stop(url):
                return visited, a
        raise Fail(f"too many redirects: {visited}")

    def log_in(self, form):
        """From the provider's login form (an Answer), the form filled in and sent; the
        provider's redirects followed up to the one to the site's callback: that answer."""
        check(form.status == 200 and 'name="id" value="' in form.body, "the provider's login form", form)
        rid = form.body.split('name="id" value="')[1].split('"')[0]
        user = f"test-user@{urllib.parse.urlsplit(form.url).hostname}"
        data = urllib.parse.urlencode({"username": user, "password": PASSWORD, "id": rid})
        a = self.request("POST", urllib.parse.urljoin(form.url, "/login/username"), data)
        for _ in range(5):
            check(a.status in (302, 303), "the login form accepted the test user", a)
            url = a.location()
            a = self.request("GET", url)
            if "/oauth2/callback" in urllib.parse.urlsplit(url).path:
                return a
        raise Fail("the provider never sent the browser back to the callback")


def session(url):
    b = Browser()
    _, form = b.follow(url)
    back = b.log_in(form)
    check(back.status == 302, "the callback redirects back to the page", back)
    check(b.cookies(url).get(COOKIE), "the callback set the session cookie", back)
    print("; ".join(f"{n}={v}" for n, v in session_cookies(b, url).items()))


def session_cookies(b, url):
    """The session cookie and its chunks the jar sends to url."""
    return {n: v for n, v in b.cookies(url).items() if n == COOKIE or n.startswith(f"{COOKIE}_") and n[len(COOKIE) + 1:].isdigit()}


def ok(what):
    print(f"ok: {what}", file=sys.stderr)


def example(url, issuer):
    site = "{0.scheme}://{0.netloc}".format(urllib.parse.urlsplit(url))
    b = Browser()

    a = b.request("GET", url, accept="application/json")
    check(a.status == 401, "an API client without a session gets 401", a)
    ok("oidc: an API client without a session gets 401, no redirect")

    a = b.request("GET", url)
    check(a.status == 302, "a page load without a session is redirected", a)
    to = a.location()
    check(to.startswith(f"{issuer}/auth?"), f"redirected to {issuer}'s authorization endpoint", to)
    q = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(to).query))
    check(q.get("client_id") == "shop" and q.get("response_type") == "code", "client_id shop, code flow", q)
    check(q.get("redirect_uri") == f"{site}/oauth2/callback", "the callback on the Gateway's origin", q)
    check(q.get("code_challenge_method") == "S256" and q.get("code_challenge"), "PKCE", q)
    check(any(n == f"{COOKIE}_login" for (_, _, n) in b.jar), "the login cookie set", a)
    ok("oidc: a page load is redirected to the provider (code flow, PKCE, the Gateway's callback)")

    _, form = b.follow(to)
    back = b.log_in(form)
    check(back.status == 302 and back.location() == url, "the callback sends the browser back to the page", back)
    check(b.cookies(url).get(COOKIE), "the callback set the session cookie", back)
    ok("oidc: logged in at the provider's form; the callback set the session cookie")

    page = b.request("GET", url)
    check(page.status == 200, "the page with the session", page)
    try:
        headers = json.loads(page.body).get("headers", {})
    except ValueError:
        raise Fail(f"the backend's answer is not its JSON echo: {page.body[:300]}")
    check(headers.get("x-user") == USER_SUB, f"the backend sees x-user: {USER_SUB}", page.body)
    ok(f"oidc: the page is served with x-user: {USER_SUB} (the ID token's sub)")

    tampered = session_cookies(b, url)
    good = tampered[COOKIE]
    tampered[COOKIE] = good[:-2] + ("AA" if good[-2:] != "AA" else "BB")
    a = b.request("GET", url, accept="application/json", cookies=tampered)
    check(a.status == 401, "a tampered session cookie gets 401", a)
    ok("oidc: a tampered session cookie is refused")

    a = b.request("GET", f"{site}/logout")
    check(a.status == 302, "/logout redirects", a)
    to = a.location()
    check(to.startswith(f"{issuer}/end_session?"), "to the provider's end_session endpoint", to)
    q = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(to).query))
    check(q.get("post_logout_redirect_uri") == f"{site}/", "back to the site after logout", q)
    check(not session_cookies(b, url), "the session cookie is cleared", b.jar)
    visited, landed = b.follow(to)
    check(f"{site}/" in visited, "the provider sends the browser back to the site", visited)
    check(landed.url.startswith(issuer) and 'name="id"' in landed.body, "the site sends it to log in again", landed)
    ok("oidc: /logout clears the session and ends it at the provider; the next page load logs in again")


def main():
    args = sys.argv[1:]
    try:
        if len(args) == 2 and args[0] == "session":
            session(args[1])
        elif len(args) == 3 and args[0] == "example":
            example(args[1], args[2].rstrip("/"))
        else:
            sys.exit(__doc__)
    except (Fail, OSError, http.client.HTTPException) as e:
        print(f"oidc-browser: FAIL: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
