package integration_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/failover-go/failover"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/azure"
	"github.com/openai/openai-go/v3/option"
)

// These tests fail over between OpenAI and Azure OpenAI under the real
// openai-go client, in both directions, with one Upstream each: Azure's
// classic path names the deployment ({deployment}, filled with the model
// after Models) and wants an api-version (Upstream.Query) and an api-key
// header; OpenAI wants neither. openai-go's azure package sends its key
// only over HTTPS (plain HTTP to loopback bypasses the client's
// RoundTripper), so the servers speak TLS.

const (
	azureVersion    = "2024-10-21"
	azureDeployment = "my-gpt4o-deployment"
	openaiUpKey     = "sk-openai-upstream-0123456789"
	azureUpKey      = "azure-upstream-0123456789"
	callerAzureKey  = "azure-caller-0123456789"
)

// azureReceived is one request a TLS upstream server saw.
type azureReceived struct {
	path   string // escaped
	query  url.Values
	header http.Header
	model  string
}

// azureLog is what one server saw, in order.
type azureLog struct {
	mu   sync.Mutex
	reqs []azureReceived
}

func (l *azureLog) all() []azureReceived {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.reqs)
}

// tlsUpstream starts a TLS server that records each request in log and
// answers with h.
func tlsUpstream(t *testing.T, log *azureLog, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var m struct {
			Model string `json:"model"`
		}
		json.Unmarshal(body, &m)
		log.mu.Lock()
		log.reqs = append(log.reqs, azureReceived{path: r.URL.EscapedPath(), query: r.URL.Query(), header: r.Header.Clone(), model: m.Model})
		log.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
		h(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// azureUpstreams are the two Upstreams both directions use: OpenAI, and
// Azure's classic deployments path at azureBase.
func azureUpstreams(openaiBase, azureBase string) (openaiUp, azureUp failover.Upstream) {
	openaiUp = failover.Upstream{
		Name:    "openai",
		BaseURL: openaiBase + "/v1",
		Header:  http.Header{"Authorization": {"Bearer " + openaiUpKey}},
		Models:  map[string]string{azureDeployment: "gpt-4o", "*": "*"},
	}
	azureUp = failover.Upstream{
		Name:    "azure",
		BaseURL: azureBase + "/openai/deployments/{deployment}",
		Header:  http.Header{"Api-Key": {azureUpKey}},
		Query:   url.Values{"api-version": {azureVersion}},
		Models:  map[string]string{"gpt-4o": azureDeployment, "*": "*"},
	}
	return openaiUp, azureUp
}

// newTLSFailover returns a Transport over ups whose Base trusts srv's
// certificate (every httptest TLS server has the same). It sends each
// request once to each upstream: the retry at the same upstream, which a
// model that differs there calls for, is off.
func newTLSFailover(t *testing.T, srv *httptest.Server, ups ...failover.Upstream) *failover.Transport {
	t.Helper()
	tr, err := failover.New(failover.Config{Upstreams: ups, Base: srv.Client().Transport, Retry: failover.RetryConfig{Off: true}})
	if err != nil {
		t.Fatalf("failover.New: %v", err)
	}
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

// checkAtOpenAI fails unless r, a request OpenAI got, has its path, no
// api-version, OpenAI's key alone and no Azure key.
func checkAtOpenAI(t *testing.T, r azureReceived, path, model string) {
	t.Helper()
	if r.path != path || r.query.Has("api-version") || r.model != model {
		t.Errorf("OpenAI got %s?%s with model %q, want %s with no api-version and model %q", r.path, r.query.Encode(), r.model, path, model)
	}
	if got := r.header.Values("Authorization"); !slices.Equal(got, []string{"Bearer " + openaiUpKey}) {
		t.Errorf("OpenAI got Authorization %q, want its own key", got)
	}
	if got := r.header.Values("Api-Key"); len(got) != 0 {
		t.Errorf("OpenAI got api-key %q, want none", got)
	}
}

// checkAtAzure fails unless r, a request Azure got, has its path, its own
// api-version, Azure's key alone and no Authorization.
func checkAtAzure(t *testing.T, r azureReceived, path string) {
	t.Helper()
	if r.path != path || !slices.Equal(r.query["api-version"], []string{azureVersion}) {
		t.Errorf("Azure got %s?%s, want %s?api-version=%s", r.path, r.query.Encode(), path, azureVersion)
	}
	if got := r.header.Values("Api-Key"); !slices.Equal(got, []string{azureUpKey}) {
		t.Errorf("Azure got api-key %q, want its own key", got)
	}
	if got := r.header.Values("Authorization"); len(got) != 0 {
		t.Errorf("Azure got Authorization %q, want none", got)
	}
}

// askFromOpenAI sends a gpt-4o chat completion through tr with openai-go
// aimed at openaiBase, checks that the answer is want, and returns what
// each server received, one request each.
func askFromOpenAI(t *testing.T, tr *failover.Transport, openaiBase, want string, openaiSaw, azureSaw *azureLog) (atOpenAI, atAzure []azureReceived) {
	t.Helper()
	client := newOpenAIClient(t, tr, openaiBase, option.WithMaxRetries(0))
	params := chatParams()
	params.Model = "gpt-4o"
	resp, err := client.Chat.Completions.New(testContext(t), params)
	if err != nil {
		t.Fatalf("Chat.Completions.New: %v", err)
	}
	if got := resp.Choices[0].Message.Content; got != want {
		t.Errorf("content %q, want %q", got, want)
	}
	atOpenAI, atAzure = openaiSaw.all(), azureSaw.all()
	if len(atOpenAI) != 1 || len(atAzure) != 1 {
		t.Fatalf("OpenAI got %d requests and Azure %d, want one each", len(atOpenAI), len(atAzure))
	}
	return atOpenAI, atAzure
}

// An OpenAI primary that answers 503 fails over to an Azure classic-path
// deployment chosen by the model, and the SDK gets Azure's answer.
func TestAzureClassicFromOpenAI(t *testing.T) {
	var openaiSaw, azureSaw azureLog
	openaiSrv := tlsUpstream(t, &openaiSaw, apiError(http.StatusServiceUnavailable, "server_error", "The server is overloaded."))
	azureSrv := tlsUpstream(t, &azureSaw, completion("from azure"))
	openaiUp, azureUp := azureUpstreams(openaiSrv.URL, azureSrv.URL)
	tr := newTLSFailover(t, azureSrv, openaiUp, azureUp)

	atOpenAI, atAzure := askFromOpenAI(t, tr, openaiUp.BaseURL, "from azure", &openaiSaw, &azureSaw)
	checkAtOpenAI(t, atOpenAI[0], "/v1/chat/completions", "gpt-4o")
	checkAtAzure(t, atAzure[0], "/openai/deployments/"+azureDeployment+"/chat/completions")
	if strings.Contains(strings.Join(atAzure[0].header.Values("Authorization"), ""), callerKey) {
		t.Error("Azure got the caller's OpenAI key")
	}
}

// The SDK configured for Azure (azure.WithEndpoint, azure.WithAPIKey),
// whose Azure primary answers 503, fails over to OpenAI with the same two
// Upstreams: OpenAI gets no api-version and no Azure key.
func TestAzureClassicToOpenAI(t *testing.T) {
	var openaiSaw, azureSaw azureLog
	openaiSrv := tlsUpstream(t, &openaiSaw, completion("from openai"))
	azureSrv := tlsUpstream(t, &azureSaw, apiError(http.StatusServiceUnavailable, "server_error", "The server is overloaded."))
	openaiUp, azureUp := azureUpstreams(openaiSrv.URL, azureSrv.URL)
	tr := newTLSFailover(t, azureSrv, azureUp, openaiUp)

	hermeticOpenAIEnv(t)
	client := openai.NewClient(
		azure.WithEndpoint(azureSrv.URL, "2024-06-01"),
		azure.WithAPIKey(callerAzureKey),
		option.WithHTTPClient(&http.Client{Transport: tr}),
		option.WithMaxRetries(0),
	)
	params := chatParams()
	params.Model = azureDeployment // Azure's convention: the model is the deployment
	resp, err := client.Chat.Completions.New(testContext(t), params)
	if err != nil {
		t.Fatalf("Chat.Completions.New: %v", err)
	}
	if got := resp.Choices[0].Message.Content; got != "from openai" {
		t.Errorf("content %q, want OpenAI's", got)
	}
	atOpenAI, atAzure := openaiSaw.all(), azureSaw.all()
	if len(atOpenAI) != 1 || len(atAzure) != 1 {
		t.Fatalf("OpenAI got %d requests and Azure %d, want one each", len(atOpenAI), len(atAzure))
	}
	checkAtAzure(t, atAzure[0], "/openai/deployments/"+azureDeployment+"/chat/completions")
	checkAtOpenAI(t, atOpenAI[0], "/v1/chat/completions", "gpt-4o")
	for _, r := range append(atOpenAI, atAzure...) {
		for k, vs := range r.header {
			if strings.Contains(strings.Join(vs, ","), callerAzureKey) {
				t.Errorf("%s got the caller's Azure key in %s", r.path, k)
			}
		}
	}
}

// Azure's v1 path (/openai/v1, no deployment, no api-version) is a plain
// upstream: a failover from OpenAI reaches it with the model mapped in
// the body.
func TestAzureV1FromOpenAI(t *testing.T) {
	var openaiSaw, azureSaw azureLog
	openaiSrv := tlsUpstream(t, &openaiSaw, apiError(http.StatusServiceUnavailable, "server_error", "The server is overloaded."))
	azureSrv := tlsUpstream(t, &azureSaw, completion("from azure v1"))
	openaiUp, _ := azureUpstreams(openaiSrv.URL, azureSrv.URL)
	azureV1 := failover.Upstream{
		Name:    "azure-v1",
		BaseURL: azureSrv.URL + "/openai/v1",
		Header:  http.Header{"Api-Key": {azureUpKey}},
		Models:  map[string]string{"gpt-4o": azureDeployment},
	}
	tr := newTLSFailover(t, azureSrv, openaiUp, azureV1)

	atOpenAI, atAzure := askFromOpenAI(t, tr, openaiUp.BaseURL, "from azure v1", &openaiSaw, &azureSaw)
	checkAtOpenAI(t, atOpenAI[0], "/v1/chat/completions", "gpt-4o")
	r := atAzure[0]
	if r.path != "/openai/v1/chat/completions" || len(r.query) != 0 || r.model != azureDeployment {
		t.Errorf("Azure v1 got %s?%s with model %q, want /openai/v1/chat/completions, no query, model %q", r.path, r.query.Encode(), r.model, azureDeployment)
	}
	if got := r.header.Values("Api-Key"); !slices.Equal(got, []string{azureUpKey}) || len(r.header.Values("Authorization")) != 0 {
		t.Errorf("Azure v1 got api-key %q and Authorization %q, want its own key alone", got, r.header.Values("Authorization"))
	}
}
