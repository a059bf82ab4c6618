//! Static bearer tokens from kube-apiserver's `--token-auth-file`: a CSV
//! file, one `token,user,uid[,"group1,group2"]` record per line. Read once
//! at start, as kube-apiserver does.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use super::UserInfo;

#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    #[error("{file}: cannot read: {source}")]
    Read {
        file: String,
        source: std::io::Error,
    },
    #[error("{file}: line {line}: {message}")]
    Invalid {
        file: String,
        line: u64,
        message: String,
    },
}

/// Token -> user.
pub struct TokenFile {
    tokens: HashMap<String, Arc<UserInfo>>,
}

impl std::fmt::Debug for TokenFile {
    // Never print the tokens.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenFile")
            .field("tokens", &self.tokens.len())
            .finish()
    }
}

impl TokenFile {
    pub fn load(path: &Path) -> Result<TokenFile, TokenFileError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| TokenFileError::Read {
            file: file.clone(),
            source,
        })?;
        TokenFile::parse(&text, &file)
    }

    /// Parses the CSV text; `file` names the source in errors. Like
    /// kube-apiserver: leading spaces of fields are trimmed, empty tokens are
    /// skipped with a warning, a duplicate token replaces the earlier one.
    pub fn parse(text: &str, file: &str) -> Result<TokenFile, TokenFileError> {
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .trim(csv::Trim::All)
            .from_reader(text.as_bytes());
        let mut tokens = HashMap::new();
        for record in reader.records() {
            let record = record.map_err(|e| TokenFileError::Invalid {
                file: file.to_string(),
                line: e.position().map(|p| p.line()).unwrap_or(0),
                message: e.to_string(),
            })?;
            let line = record.position().map(|p| p.line()).unwrap_or(0);
            if record.len() < 3 {
                return Err(TokenFileError::Invalid {
                    file: file.to_string(),
                    line,
                    message: format!(
                        "want at least 3 columns (token, user name, user uid), found {}",
                        record.len()
                    ),
                });
            }
            let token = &record[0];
            if token.is_empty() {
                tracing::warn!(file, line, "empty token in the token file; skipped");
                continue;
            }
            if record[1].is_empty() {
                return Err(TokenFileError::Invalid {
                    file: file.to_string(),
                    line,
                    message: "empty user name".into(),
                });
            }
            let groups = record
                .get(3)
                .map(|g| {
                    g.split(',')
                        .map(str::trim)
                        .filter(|g| !g.is_empty())
                        .map(String::from)
                        .collect()
                })
                .unwrap_or_default();
            let user = UserInfo {
                name: record[1].to_string(),
                uid: record[2].to_string(),
                groups,
                ..Default::default()
            };
            if tokens.insert(token.to_string(), Arc::new(user)).is_some() {
                tracing::warn!(
                    file,
                    line,
                    "duplicate token in the token file; the later one wins"
                );
            }
        }
        Ok(TokenFile { tokens })
    }

    pub fn lookup(&self, token: &str) -> Option<&Arc<UserInfo>> {
        self.tokens.get(token)
    }

    /// Every user changed by `f` (the authenticator adds its group once).
    pub(super) fn map_users(self, f: impl Fn(UserInfo) -> UserInfo) -> TokenFile {
        let tokens = self
            .tokens
            .into_iter()
            .map(|(t, u)| (t, Arc::new(f(Arc::unwrap_or_clone(u)))))
            .collect();
        TokenFile { tokens }
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_format() {
        let t = TokenFile::parse(
            "abc,alice,1001,\"dev, ops\"\ndef, bob ,1002\n,nobody,1\nabc,carol,1003,x\n",
            "tokens.csv",
        )
        .unwrap();
        assert_eq!(t.len(), 2);
        let carol = t.lookup("abc").unwrap();
        assert_eq!(carol.name, "carol");
        assert_eq!(carol.groups, ["x"]);
        let bob = t.lookup("def").unwrap();
        assert_eq!((bob.name.as_str(), bob.uid.as_str()), ("bob", "1002"));
        assert!(bob.groups.is_empty());
        assert!(t.lookup("").is_none());
        assert!(t.lookup("nope").is_none());
        let t = TokenFile::parse("abc,alice,1001,\"dev,ops\"\n", "t").unwrap();
        assert_eq!(t.lookup("abc").unwrap().groups, ["dev", "ops"]);
    }

    #[test]
    fn errors_name_file_and_line() {
        let e = TokenFile::parse("a,b,c\nshort,row\n", "/etc/tokens.csv")
            .unwrap_err()
            .to_string();
        assert!(e.contains("/etc/tokens.csv"), "{e}");
        assert!(e.contains("line 2"), "{e}");
        assert!(e.contains("at least 3 columns"), "{e}");
        let e = TokenFile::parse("a,,c\n", "t.csv").unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("empty user name"), "{e}");
        let e = TokenFile::load(Path::new("/nonexistent/tokens.csv"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/tokens.csv"), "{e}");
    }

    #[test]
    fn debug_hides_tokens() {
        let t = TokenFile::parse("secret-token,alice,1\n", "t").unwrap();
        assert!(!format!("{t:?}").contains("secret-token"));
    }
}
