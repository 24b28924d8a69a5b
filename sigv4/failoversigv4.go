// Package failoversigv4 signs each request a [failover.Transport] sends to
// an upstream with AWS Signature Version 4, over the body as it is sent:
// Amazon Bedrock's OpenAI-compatible endpoint, behind or before other
// providers:
//
//	cfg, err := config.LoadDefaultConfig(ctx) // github.com/aws/aws-sdk-go-v2/config
//	up := failover.Upstream{Name: "bedrock",
//		BaseURL:    "https://bedrock-runtime.us-west-2.amazonaws.com/openai/v1",
//		Models:     map[string]string{"gpt-4o": "openai.gpt-oss-120b-1:0"},
//		Authorizer: failoversigv4.New(cfg.Credentials, "us-west-2", "bedrock")}
//
// The signature covers the body with the model Upstream.Models mapped, so a
// request that fails over to Bedrock from another provider verifies.
//
// It is a module of its own (github.com/failover-go/failover/sigv4), so
// that the AWS SDK is a dependency of the programs that import it, never
// of those that import the root package.
package failoversigv4

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"

	"github.com/failover-go/failover"
)

// emptyHash is the SHA-256 of an empty payload.
const emptyHash = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

// Errors of an Authorizer of New's, which fail the attempt
// ([failover.ErrAuthorize]).
var (
	errNoGetBody = errors.New("failoversigv4: the request body cannot be replayed (no GetBody), so it cannot be signed")
	errConfig    = errors.New("failoversigv4: New needs a credentials provider, a region and a service")
)

// New returns an Authorizer that signs each request with SigV4 for region
// and service ("bedrock" for Bedrock's runtime and its OpenAI-compatible
// endpoint), with credentials from creds, cached (aws.NewCredentialsCache)
// unless creds is an *aws.CredentialsCache already. It sets
// Authorization, X-Amz-Date and, for temporary credentials,
// X-Amz-Security-Token, signing every header the request carries.
//
// The payload hash is that of the body the request sends, read from
// GetBody. A request with a body but no GetBody (a body larger than
// Config.MaxBodyBuffer without a GetBody of the caller's) is not signed:
// its attempt fails, as Bedrock refuses an unsigned payload. A nil creds
// or an empty region or service fails every attempt likewise.
func New(creds aws.CredentialsProvider, region, service string) failover.Authorizer {
	if creds == nil || region == "" || service == "" {
		return failover.AuthorizerFunc(func(*http.Request) error { return errConfig })
	}
	if _, ok := creds.(*aws.CredentialsCache); !ok {
		creds = aws.NewCredentialsCache(creds)
	}
	return &signer{creds: creds, region: region, service: service, v4: v4.NewSigner()}
}

type signer struct {
	creds           aws.CredentialsProvider
	region, service string
	v4              *v4.Signer
}

// Authorize implements [failover.Authorizer].
func (s *signer) Authorize(req *http.Request) error {
	hash, err := payloadHash(req)
	if err != nil {
		return err
	}
	creds, err := s.creds.Retrieve(req.Context())
	if err != nil {
		return fmt.Errorf("failoversigv4: retrieving credentials: %w", err)
	}
	// A caller's Authorization went to the upstream it addressed: the
	// signature replaces it.
	req.Header.Del("Authorization")
	if err := s.v4.SignHTTP(req.Context(), creds, req, hash, s.service, s.region, time.Now()); err != nil {
		return fmt.Errorf("failoversigv4: %w", err)
	}
	return nil
}

// payloadHash returns the hex SHA-256 of req's body, read from GetBody.
func payloadHash(req *http.Request) (string, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return emptyHash, nil
	}
	if req.GetBody == nil {
		return "", errNoGetBody
	}
	rc, err := req.GetBody()
	if err != nil {
		return "", fmt.Errorf("failoversigv4: reading the body: %w", err)
	}
	defer rc.Close()
	h := sha256.New()
	if _, err := io.Copy(h, rc); err != nil {
		return "", fmt.Errorf("failoversigv4: reading the body: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
