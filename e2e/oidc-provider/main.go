// oidc-provider: zitadel/oidc's example OpenID Provider (example/server: its in-memory
// storage, login form and test users), started on a loopback port of the caller's choice with
// one confidential client registered for Tollgate's OIDC tests.
//
// Flags (all optional):
//
//	-listen 127.0.0.1:0        address; port 0 picks a free one
//	-client shop               client_id of the registered web client
//	-secret shop-secret        its client_secret (client_secret_basic or _post)
//	-id-token-lifetime 1h      lifetime of the ID tokens it issues (short ones test refresh)
//
// On start it prints one line to stdout, `issuer http://HOST:PORT`, once it accepts
// connections. The client accepts any redirect and post-logout URI on 127.0.0.0/8 and
// localhost (globs), so a test can register nothing before it knows its proxy's port.
// Users (from the example's storage): `test-user@HOST` (the issuer's host: `test-user@127.0.0.1`
// on 127.0.0.1; sub `id1`) and `test-user2`, both with the password `verysecure`.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/zitadel/oidc/v3/example/server/exampleop"
	"github.com/zitadel/oidc/v3/example/server/storage"
	"github.com/zitadel/oidc/v3/pkg/op"
)

// testClient overrides what the example's web client fixes: the ID token lifetime and the
// redirect globs (the example allows globs only through its own dev-mode wrapper).
type testClient struct {
	op.Client
	idTokenLifetime time.Duration
}

func (c testClient) IDTokenLifetime() time.Duration { return c.idTokenLifetime }

// 127.* is the whole loopback network: the loopback cluster's Gateways answer on 127.0.1.N
// (e2e/examples-test.sh logs in through one).
var globs = []string{
	"http://127.*:*/*", "http://127.*:*/*/*", "http://127.*:*",
	"http://localhost:*/*", "http://localhost:*/*/*", "http://localhost:*",
}

func (c testClient) RedirectURIGlobs() []string           { return globs }
func (c testClient) PostLogoutRedirectURIGlobs() []string { return globs }

// testStorage is the example's storage with testClient in place of the registered client.
type testStorage struct {
	*storage.Storage
	clientID        string
	idTokenLifetime time.Duration
}

func (s testStorage) GetClientByClientID(ctx context.Context, id string) (op.Client, error) {
	c, err := s.Storage.GetClientByClientID(ctx, id)
	if err != nil || id != s.clientID {
		return c, err
	}
	return testClient{Client: c, idTokenLifetime: s.idTokenLifetime}, nil
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "listen address")
	clientID := flag.String("client", "shop", "client_id")
	secret := flag.String("secret", "shop-secret", "client_secret")
	lifetime := flag.Duration("id-token-lifetime", time.Hour, "ID token lifetime")
	flag.Parse()

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "listen:", err)
		os.Exit(1)
	}
	issuer := fmt.Sprintf("http://%s", ln.Addr().String())
	// The client's own redirect URI list stays empty: the globs above admit the tests'.
	storage.RegisterClients(storage.WebClient(*clientID, *secret, "http://127.0.0.1/unused"))
	store := testStorage{
		Storage:         storage.NewStorage(storage.NewUserStore(issuer)),
		clientID:        *clientID,
		idTokenLifetime: *lifetime,
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	router := exampleop.SetupServer(issuer, store, logger, false)
	fmt.Printf("issuer %s\n", issuer)
	if err := http.Serve(ln, router); err != nil {
		fmt.Fprintln(os.Stderr, "serve:", err)
		os.Exit(1)
	}
}
