//! Downloads DynamoDB Local's pinned artifacts (`artifacts.txt`) from a Maven repository and checks each
//! against its SHA-256: the install needs no Maven. A file already in the local Maven repository
//! (`~/.m2/repository`) with the same checksum is copied instead.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use sha2::{Digest, Sha256};

/// Environment variable naming the Maven repository to download from (a mirror), instead of Central.
pub const REPOSITORY_ENV: &str = "DYNAMODB_LOCAL_MAVEN_REPOSITORY";
/// Maven Central.
pub const CENTRAL: &str = "https://repo1.maven.org/maven2";

pub(crate) const ARTIFACTS_TXT: &str = include_str!("../artifacts.txt");
/// Downloads at a time: enough to keep one connection's worth of bandwidth busy on small files.
const PARALLEL: usize = 8;
const ATTEMPTS: u32 = 3;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// One pinned file: its path under a Maven repository's root and its SHA-256 (lowercase hex).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Artifact {
    pub path: String,
    pub sha256: String,
}

impl Artifact {
    pub fn file_name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or(&self.path)
    }
}

/// The artifacts of `artifacts.txt` (`#` comments and blank lines skipped).
pub(crate) fn pinned() -> Vec<Artifact> {
    parse(ARTIFACTS_TXT).expect("artifacts.txt is well formed (checked by a test)")
}

pub(crate) fn parse(text: &str) -> Result<Vec<Artifact>, String> {
    let mut artifacts = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut fields = line.split_whitespace();
        let (Some(path), Some(sha256), None) = (fields.next(), fields.next(), fields.next()) else {
            return Err(format!("line {}: expected `<path> <sha256>`: {line}", number + 1));
        };
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return Err(format!("line {}: not a lowercase SHA-256: {sha256}", number + 1));
        }
        if path.starts_with('/') || path.split('/').any(|part| part.is_empty() || part == "." || part == "..") {
            return Err(format!("line {}: not a relative repository path: {path}", number + 1));
        }
        artifacts.push(Artifact { path: path.to_owned(), sha256: sha256.to_owned() });
    }
    Ok(artifacts)
}

/// Where the artifacts come from.
#[derive(Debug, Clone)]
pub(crate) struct Sources {
    /// A repository's base URL, without a trailing `/`.
    pub repository: String,
    /// A local Maven repository to copy matching files from, if any.
    pub local_repository: Option<PathBuf>,
}

impl Sources {
    /// `$DYNAMODB_LOCAL_MAVEN_REPOSITORY` or Central, and `~/.m2/repository`.
    pub fn from_environment() -> Sources {
        let repository = std::env::var(REPOSITORY_ENV).ok().filter(|url| !url.trim().is_empty());
        let repository = repository.unwrap_or_else(|| CENTRAL.to_owned()).trim().trim_end_matches('/').to_owned();
        let local_repository = std::env::var_os("HOME")
            .filter(|home| !home.is_empty())
            .map(|home| Path::new(&home).join(".m2/repository"));
        Sources { repository, local_repository }
    }
}

/// What [`fetch_into`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Fetched {
    pub downloaded: usize,
    pub copied: usize,
    pub bytes: u64,
}

/// Puts every artifact into `dir` under its file name, each checked against its checksum. Runs on a
/// thread of its own with its own runtime, so any caller may block on it (an async one included).
pub(crate) fn fetch_into(artifacts: Vec<Artifact>, dir: &Path, sources: Sources) -> Result<Fetched, String> {
    let dir = dir.to_path_buf();
    std::thread::Builder::new()
        .name("dynamodb-local-fetch".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("cannot start a runtime for the download: {e}"))?;
            runtime.block_on(fetch_all(artifacts, &dir, &sources))
        })
        .map_err(|e| format!("cannot start the download thread: {e}"))?
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

async fn fetch_all(artifacts: Vec<Artifact>, dir: &Path, sources: &Sources) -> Result<Fetched, String> {
    let http = Arc::new(client()?);
    let results: Vec<(u64, bool)> = futures::stream::iter(artifacts)
        .map(|artifact| {
            let http = Arc::clone(&http);
            async move { fetch_one(&http, &artifact, dir, sources).await }
        })
        .buffer_unordered(PARALLEL)
        .try_collect()
        .await?;
    let mut fetched = Fetched::default();
    for (bytes, copied) in results {
        fetched.bytes += bytes;
        if copied {
            fetched.copied += 1;
        } else {
            fetched.downloaded += 1;
        }
    }
    Ok(fetched)
}

/// The file's size, and whether it came from the local repository.
async fn fetch_one(
    http: &reqwest::Client,
    artifact: &Artifact,
    dir: &Path,
    sources: &Sources,
) -> Result<(u64, bool), String> {
    let target = dir.join(artifact.file_name());
    if let Some(local) = &sources.local_repository
        && let Ok(bytes) = fs::read(local.join(&artifact.path))
        && sha256_hex(&bytes) == artifact.sha256
    {
        write(&target, &bytes)?;
        return Ok((bytes.len() as u64, true));
    }
    let url = format!("{}/{}", sources.repository, artifact.path);
    let bytes = download(http, &url).await?;
    let found = sha256_hex(&bytes);
    if found != artifact.sha256 {
        return Err(format!(
            "{url}: SHA-256 {found}, but artifacts.txt pins {} (a mirror serving other content, or a tampered download): nothing installed",
            artifact.sha256
        ));
    }
    write(&target, &bytes)?;
    Ok((bytes.len() as u64, false))
}

/// The body of a 200, retrying what may pass (no answer, a 5xx, 429); any other status fails at once.
async fn download(http: &reqwest::Client, url: &str) -> Result<Vec<u8>, String> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let failure = match http.get(url).send().await {
            Ok(response) if response.status().is_success() => match response.bytes().await {
                Ok(body) => return Ok(body.to_vec()),
                Err(error) => format!("reading the body failed: {error}"),
            },
            Ok(response) => {
                let status = response.status();
                if !(status.is_server_error() || status.as_u16() == 429) {
                    return Err(format!("{url}: HTTP {status}"));
                }
                format!("HTTP {status}")
            }
            Err(error) => format!("{error}"),
        };
        if attempt >= ATTEMPTS {
            return Err(format!("{url}: {failure} ({attempt} attempts)"));
        }
        tokio::time::sleep(Duration::from_millis(500 * u64::from(attempt))).await;
    }
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), String> {
    fs::write(path, bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// HTTPS on aws-lc-rs, the provider the workspace's AWS SDK clients link already (as `twopc::https`,
/// which this crate does not depend on), with the system's root certificates.
fn client() -> Result<reqwest::Client, String> {
    let mut roots = rustls::RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(found.certs);
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .connect_timeout(Duration::from_secs(10))
        .timeout(REQUEST_TIMEOUT)
        .build()
        .map_err(|e| format!("cannot build an HTTP client: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn the_pinned_list_is_well_formed_and_names_dynamodb_local() {
        let artifacts = pinned();
        let names: HashSet<&str> = artifacts.iter().map(Artifact::file_name).collect();
        assert_eq!(names.len(), artifacts.len(), "two artifacts would overwrite one file");
        let jar = format!("DynamoDBLocal-{}.jar", crate::DYNAMODB_LOCAL_VERSION);
        assert!(names.contains(jar.as_str()), "{jar} is not pinned");
        // DynamoDB Local loads sqlite4java's native library for this platform from lib/.
        assert!(names.iter().any(|name| name.starts_with("libsqlite4java-linux-amd64")));
        assert!(parse("a/b.jar 0123").is_err());
        assert!(parse("../b.jar 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef").is_err());
    }

    /// A repository on 127.0.0.1 answering every path with `body` (or 404 for paths containing "missing").
    async fn repository(body: &'static [u8]) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut request = vec![0; 4096];
                    let n = stream.read(&mut request).await.unwrap_or(0);
                    let head = String::from_utf8_lossy(&request[..n]).into_owned();
                    let answer = if head.contains("missing") {
                        b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_vec()
                    } else {
                        let mut answer =
                            format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len())
                                .into_bytes();
                        answer.extend_from_slice(body);
                        answer
                    };
                    let _ = stream.write_all(&answer).await;
                });
            }
        });
        format!("http://{address}")
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("dynamodb-local-fetch-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn artifact(path: &str, content: &[u8]) -> Artifact {
        Artifact { path: path.into(), sha256: sha256_hex(content) }
    }

    // Multi-threaded: `fetch_into` blocks its caller's thread while the repository answers on another.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_file_whose_checksum_differs_is_refused_by_name() {
        let repository = repository(b"not the jar").await;
        let dir = temp_dir("refused");
        let pinned = artifact("org/x/x/1/x-1.jar", b"the jar");
        let sources = Sources { repository: repository.clone(), local_repository: None };
        let error = fetch_into(vec![pinned], &dir, sources).unwrap_err();
        assert!(error.contains(&format!("{repository}/org/x/x/1/x-1.jar")) && error.contains("SHA-256"), "{error}");
        assert!(!dir.join("x-1.jar").exists(), "a refused file is not written");
    }

    // Multi-threaded: `fetch_into` blocks its caller's thread while the repository answers on another.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn files_are_downloaded_or_copied_from_the_local_repository() {
        let repository = repository(b"served").await;
        let dir = temp_dir("fetched");
        let local = temp_dir("m2");
        fs::create_dir_all(local.join("org/y/y/1")).unwrap();
        fs::write(local.join("org/y/y/1/y-1.jar"), b"local").unwrap();
        // A local file with another checksum is not used: the download is.
        fs::create_dir_all(local.join("org/z/z/1")).unwrap();
        fs::write(local.join("org/z/z/1/z-1.jar"), b"stale").unwrap();
        let artifacts = vec![artifact("org/y/y/1/y-1.jar", b"local"), artifact("org/z/z/1/z-1.jar", b"served")];
        let sources = Sources { repository, local_repository: Some(local.clone()) };
        let fetched = fetch_into(artifacts, &dir, sources).unwrap();
        assert_eq!(fetched, Fetched { downloaded: 1, copied: 1, bytes: 11 });
        assert_eq!(fs::read(dir.join("y-1.jar")).unwrap(), b"local");
        assert_eq!(fs::read(dir.join("z-1.jar")).unwrap(), b"served");
        for dir in [dir, local] {
            fs::remove_dir_all(dir).unwrap();
        }
    }

    // Multi-threaded: `fetch_into` blocks its caller's thread while the repository answers on another.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_missing_file_fails_at_once_naming_its_url() {
        let repository = repository(b"served").await;
        let dir = temp_dir("missing");
        let missing = artifact("org/missing/1/missing-1.jar", b"served");
        let sources = Sources { repository: repository.clone(), local_repository: None };
        let error = fetch_into(vec![missing], &dir, sources).unwrap_err();
        assert_eq!(error, format!("{repository}/org/missing/1/missing-1.jar: HTTP 404 Not Found"));
        fs::remove_dir_all(dir).unwrap();
    }
}
