// Package security is gradsync's transport security and authorisation:
// a development PKI (InitCerts on disk, EphemeralPKI in memory), TLS
// configurations for servers, API clients, workers and worker peers, client
// tokens, and gRPC interceptors (Authorizer) that decide per service who may
// call what.
//
// # Who proves what
//
//   - API clients (gradsync CLI, grpcurl, any gRPC client) prove they are
//     clients with a bearer token: metadata "authorization: bearer <token>",
//     compared in constant time against the server's accepted tokens
//     (LoadTokens: a file with one token per line and/or $GRADSYNC_TOKEN;
//     TokenCredentials sends one). They verify the server against the CA and
//     present no certificate.
//   - Workers prove they are workers with a client certificate signed by the
//     cluster CA that carries the URI SAN spiffe://gradsync/worker
//     (WorkerRoleURI). The role is the URI SAN only; the Subject (CN, OU) is
//     informational. The server certificate carries spiffe://gradsync/server
//     instead, so it cannot stand in for a worker.
//   - Servers prove their identity to everyone by a certificate whose
//     DNS/IP SANs name the host (CertOptions.Hosts). Between workers, names
//     are not checked (peers are dialled by the addresses the coordinator
//     hands out); PeerClientTLS verifies the chain and the worker role
//     instead.
//
// # Authorisation table
//
// Enforced by Authorizer on a server built with ServerTLS (client
// certificates verified if given) and on a worker's peer endpoint built with
// PeerServerTLS (client certificate required at the handshake). "Worker
// cert" means a certificate verified against the CA carrying the worker
// role; "other cert" a verified certificate without it.
//
//	service                           class   no creds         valid token      wrong token      worker cert          worker cert + token  other cert (no token)
//	gradsync.v1.JobService            public  Unauthenticated  OK               Unauthenticated  PermissionDenied     PermissionDenied     Unauthenticated
//	gradsync.v1.ClusterService        public  Unauthenticated  OK               Unauthenticated  PermissionDenied     PermissionDenied     Unauthenticated
//	gradsync.v1.Coordinator           worker  Unauthenticated  PermissionDenied Unauthenticated  OK                   OK                   PermissionDenied
//	gradsync.v1.ParameterServer       worker  Unauthenticated  PermissionDenied Unauthenticated  OK                   OK                   PermissionDenied
//	gradsync.v1.Collective            worker  handshake fails on PeerServerTLS; on ServerTLS as Coordinator
//	grpc.health.v1.Health             open    OK               OK               OK               OK                   OK                   OK
//	grpc.reflection.v1(alpha).*       open    OK               OK               OK               OK                   OK                   OK
//	any other service                 -       PermissionDenied (fail closed: classify it first)
//
// Messages: "missing bearer token", "invalid token", "workers may not
// submit jobs", "clients may not call worker RPCs", "... lacks the worker
// role"; each names the service and what it needs. A certificate signed by
// another CA never gets this far: the handshake fails (Unavailable at the
// client).
//
// Decisions:
//   - A worker certificate on a public RPC is PermissionDenied even with a
//     valid token: workers never submit or cancel jobs.
//   - A valid client token without a certificate on a worker RPC is
//     PermissionDenied ("clients may not call worker RPCs"); no token and no
//     certificate is Unauthenticated. There is no join-token alternative:
//     a worker needs a certificate.
//   - Reflection is open, like health: the schemas are public (they are in
//     the repository), reflection returns no job data, and `grpcurl list`
//     must work (DESIGN.md, Wire rules). To gate it, move
//     grpc.reflection.v1.ServerReflection and
//     grpc.reflection.v1alpha.ServerReflection from OpenServices to
//     PublicServices. Clients needing the token for reflection would then
//     use grpcurl -H 'authorization: bearer ...'.
//   - A service in no list is PermissionDenied. The middleware's
//     AuthFuncOverride hook is disabled, so no service can exempt itself.
//   - TLS with no token configured refuses every public RPC;
//     AuthOptions.Validate reports it so a server can refuse to start.
//   - Insecure (plaintext, explicitly asked for): tokens are still checked
//     when configured (with none, public RPCs are open); roles cannot be
//     checked, so worker RPCs are open to anyone who can reach the port.
//     Clients then use TokenCredentials(token, false).
//
// The admitted caller is in the handler's context: PrincipalFromContext.
//
// # Files (InitCerts)
//
//	ca.pem, ca-key.pem           ECDSA P-256 CA (0644 / 0600); keep ca-key.pem off the cluster
//	server.pem, server-key.pem   server + client auth, SANs = Hosts, URI spiffe://gradsync/server
//	worker.pem, worker-key.pem   server + client auth, SANs = WorkerHosts, URI spiffe://gradsync/worker
//	token                        random client API token (0600), one line
//
// Every file is written to a temporary file and linked (or, with Force,
// renamed) into place; without Force existing files are never replaced.
//
// # Wiring
//
//	u, s := security.Authorizer(security.AuthOptions{Tokens: toks})
//	// chain after recovery and logging, before validation:
//	grpc.ChainUnaryInterceptor(recovery..., logging..., u, validator...)
//	grpc.Creds(security.Credentials(serverTLS))
//	// clients:
//	grpc.WithTransportCredentials(security.Credentials(clientTLS)),
//	grpc.WithPerRPCCredentials(security.TokenCredentials(tok, true))
package security
