// Package failoveroauth2 sets an OAuth 2.0 access token on each request a
// [failover.Transport] sends to an upstream, refreshing it as it expires:
//
//	ts := clientcredentials.Config{ClientID: id, ClientSecret: secret, TokenURL: tokenURL}
//	up := failover.Upstream{Name: "azure", BaseURL: "https://res.openai.azure.com/openai/v1",
//		Authorizer: failoveroauth2.New(ts.TokenSource(ctx))}
//
// Azure OpenAI with Microsoft Entra ID takes the token as a Bearer
// Authorization too: a token source for [AzureOpenAIScope] (from
// clientcredentials with microsoft.AzureADEndpoint(tenant).TokenURL, or
// any other TokenSource) is all it needs. Google's token sources
// (golang.org/x/oauth2/google, for Vertex AI) fit as they are.
//
// It is a module of its own (github.com/failover-go/failover/oauth2), so
// that golang.org/x/oauth2 is a dependency of the programs that import it,
// never of those that import the root package.
package failoveroauth2

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"golang.org/x/oauth2"

	"github.com/failover-go/failover"
)

// AzureOpenAIScope is the scope of a Microsoft Entra ID token for Azure
// OpenAI (Cognitive Services).
const AzureOpenAIScope = "https://cognitiveservices.azure.com/.default"

// errNoToken is a token source that returned a token without an access
// token.
var errNoToken = errors.New("failoveroauth2: the token source returned an empty access token")

// New returns an Authorizer that sets each request's Authorization header
// to ts's token, as "TYPE TOKEN" (oauth2.Token.SetAuthHeader: TYPE is
// "Bearer" unless the token says otherwise). ts is wrapped in
// oauth2.ReuseTokenSource, which fetches a new token only when the last
// one is about to expire; a source that already reuses its tokens
// (clientcredentials', ReuseTokenSourceWithExpiry's) is kept as it is.
// An error of ts's fails the attempt ([failover.ErrAuthorize]) and the
// request goes on to the next upstream; so does a token that does not
// come before the attempt's context ends (its timeout, the caller's
// deadline), though Token takes no context: one call of it is in flight
// at a time, which the attempts wait for.
func New(ts oauth2.TokenSource) failover.Authorizer {
	return &authorizer{ts: oauth2.ReuseTokenSource(nil, ts)}
}

type authorizer struct {
	ts oauth2.TokenSource // safe for concurrent use: a reuseTokenSource

	mu   sync.Mutex
	call *tokenCall // the call of ts.Token in flight; nil when there is none
}

// tokenCall is one call of Token: done is closed once tok and err are set.
type tokenCall struct {
	done chan struct{}
	tok  *oauth2.Token
	err  error
}

// Authorize implements [failover.Authorizer].
func (a *authorizer) Authorize(req *http.Request) error {
	tok, err := a.token(req.Context())
	if err != nil {
		return fmt.Errorf("failoveroauth2: %w", err)
	}
	if tok.AccessToken == "" {
		return errNoToken
	}
	tok.SetAuthHeader(req)
	return nil
}

// token is ts.Token's token, waited for until ctx ends: Token takes no
// context, and a token endpoint that hangs must hold no attempt past its
// bound or its caller's deadline. One call of Token is in flight at a
// time, which every attempt waits for.
func (a *authorizer) token(ctx context.Context) (*oauth2.Token, error) {
	a.mu.Lock()
	c := a.call
	if c == nil {
		c = &tokenCall{done: make(chan struct{})}
		a.call = c
		go func() {
			defer func() {
				if v := recover(); v != nil { // as the Transport recovers an Authorizer's
					c.tok, c.err = nil, fmt.Errorf("panic in the token source: %v", v)
				}
				a.mu.Lock()
				a.call = nil
				a.mu.Unlock()
				close(c.done)
			}()
			c.tok, c.err = a.ts.Token()
		}()
	}
	a.mu.Unlock()
	select {
	case <-c.done:
		return c.tok, c.err
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for a token: %w", context.Cause(ctx))
	}
}
