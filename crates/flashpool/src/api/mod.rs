//! The management API: HTTP + JSON, on 127.0.0.1 by default; HTTPS only
//! off loopback. Every call needs a credential ([`auth`]).
//! Every answer is JSON; an error is `{"error": "..."}` with a status code
//! that says whose fault it was (400 bad request, 404 unknown name or call,
//! 405 a method the call does not take, 409 conflicts with the node's
//! state, 413 a body over [`BODY_LIMIT`], 500 the node's own failure).
//! `docs/api.md` lists the calls.
//!
//! [`router`] maps the calls to [`handlers`] (the node's and the cluster's
//! calls) and [`events`] (the event stream); [`errors`] makes every error
//! JSON; [`auth`] decides who may call ([`token`], [`limiter`]);
//! [`server`] binds the listeners ([`listen`], with [`tls`] for HTTPS).

mod auth;
mod errors;
mod events;
mod handlers;
mod limiter;
mod listen;
mod router;
mod server;
mod snapshots;
#[cfg(test)]
mod tests;
mod tls;
pub(crate) mod token;

pub use handlers::App;
// The node and agent tests serve the router without the server around it.
#[cfg(test)]
pub use router::router;
pub use server::{Started, check, start};
