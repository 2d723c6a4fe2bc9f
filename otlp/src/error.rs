//! The error of a setting that cannot be used, and the means by which the
//! configuration and the TLS material make one.

use std::fmt;

/// A setting that cannot be used: what is wrong and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    message: String,
    /// No endpoint was given and none is set in the environment.
    missing_endpoint: bool,
}

impl ConfigError {
    /// The error `message` says.
    pub(crate) fn new(message: String) -> ConfigError {
        ConfigError {
            message,
            missing_endpoint: false,
        }
    }

    /// No endpoint was given and none is set in the environment, as
    /// `message` says.
    pub(crate) fn missing_endpoint(message: String) -> ConfigError {
        ConfigError {
            message,
            missing_endpoint: true,
        }
    }

    /// Whether it says that no endpoint was given and none is set in the
    /// environment (a program may say so in its own terms: which option
    /// gives one).
    pub fn is_missing_endpoint(&self) -> bool {
        self.missing_endpoint
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

/// A [`ConfigError`] of a formatted message.
macro_rules! err {
    ($($t:tt)*) => { $crate::error::ConfigError::new(format!($($t)*)) };
}

/// Returns a [`ConfigError`] of a formatted message.
macro_rules! bail {
    ($($t:tt)*) => { return Err($crate::error::err!($($t)*)) };
}

pub(crate) use {bail, err};

/// `with_context` for the errors met while reading the settings.
pub(crate) trait Context<T> {
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T, ConfigError>;
}

impl<T, E: fmt::Display> Context<T> for Result<T, E> {
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T, ConfigError> {
        self.map_err(|e| err!("{}: {e}", what()))
    }
}
