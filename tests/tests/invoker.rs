//! The Lambda invoker through the real aws-sdk-lambda client, against a local Invoke API that answers
//! the way the service does and the way `cargo lambda watch` does.

use std::collections::BTreeMap;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use twopc::invoke::{InvokeError, LambdaInvoker, ParticipantInvoker};
use twopc::model::{Action, ParticipantRequest, Vote};

/// Serves one canned HTTP answer per connection; returns the endpoint.
async fn invoke_api(status: u16, headers: &'static [(&'static str, &'static str)], body: &'static str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut request = Vec::new();
            let mut buffer = [0u8; 4096];
            // Read the headers, then as much body as Content-Length says.
            loop {
                let n = socket.read(&mut buffer).await.unwrap_or(0);
                if n == 0 {
                    break;
                }
                request.extend_from_slice(&buffer[..n]);
                let text = String::from_utf8_lossy(&request);
                if let Some(end) = text.find("\r\n\r\n") {
                    let length = text[..end]
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned())
                        })
                        .and_then(|v| v.parse::<usize>().ok())
                        .unwrap_or(0);
                    if request.len() >= end + 4 + length {
                        break;
                    }
                }
            }
            let mut answer =
                format!("HTTP/1.1 {status} X\r\ncontent-length: {}\r\ncontent-type: application/json\r\n", body.len());
            for (name, value) in headers {
                answer += &format!("{name}: {value}\r\n");
            }
            answer += "\r\n";
            answer += body;
            let _ = socket.write_all(answer.as_bytes()).await;
        }
    });
    endpoint
}

fn invoker(endpoint: &str) -> LambdaInvoker {
    let config = aws_sdk_lambda::Config::builder()
        .behavior_version(aws_sdk_lambda::config::BehaviorVersion::latest())
        .region(aws_sdk_lambda::config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_lambda::config::Credentials::new("local", "local", None, None, "tests"))
        .endpoint_url(endpoint)
        .build();
    LambdaInvoker::new(
        aws_sdk_lambda::Client::from_conf(config),
        BTreeMap::from([("svc".into(), "participant".into())]),
    )
}

fn prepare() -> ParticipantRequest {
    ParticipantRequest::new(Action::Prepare, "tx-1")
}

#[tokio::test]
async fn a_vote_comes_back_as_the_participant_answered() {
    let endpoint = invoke_api(200, &[], r#"{"vote": "PREPARED"}"#).await;
    let answer = invoker(&endpoint).invoke("svc", &prepare()).await.unwrap();
    assert_eq!(answer.vote, Some(Vote::Prepared));
}

#[tokio::test]
async fn a_function_error_from_the_service_is_a_failure_not_a_vote() {
    let endpoint = invoke_api(
        200,
        &[("x-amz-function-error", "Unhandled")],
        r#"{"errorType": "HandlerError", "errorMessage": "DynamoDB was unreachable"}"#,
    )
    .await;
    let error = invoker(&endpoint).invoke("svc", &prepare()).await.unwrap_err();
    assert!(
        matches!(&error, InvokeError::FunctionError { message, .. } if message.contains("DynamoDB was unreachable")),
        "{error}"
    );
}

/// The registry's local form (`http://host:port/function`): one `cargo lambda watch`'s Invoke API.
fn local_invoker(endpoint: &str) -> LambdaInvoker {
    let credentials = aws_sdk_lambda::config::Credentials::new("local", "local", None, None, "tests");
    let config = aws_config::SdkConfig::builder()
        .behavior_version(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_lambda::config::SharedCredentialsProvider::new(credentials))
        .build();
    LambdaInvoker::from_registry(&config, BTreeMap::from([("svc".into(), format!("{endpoint}/participant"))]))
}

/// `cargo lambda watch` answers a handler's error with a 500: from a local Invoke API, that is the
/// function's failure (its execution is over). From the Lambda service, a 500 is the service's own error
/// (ServiceException), which proves nothing about the function: a transport failure, never taken for an
/// ended execution (issue 48: the coordinator would end an abort too soon on that word).
#[tokio::test]
async fn a_500_from_cargo_lambda_watch_is_a_function_failure_too() {
    let body = r#"{"errorType": "HandlerError", "errorMessage": "DynamoDB was unreachable"}"#;
    let endpoint = invoke_api(500, &[], body).await;
    let error = local_invoker(&endpoint).invoke("svc", &prepare()).await.unwrap_err();
    assert!(
        matches!(&error, InvokeError::FunctionError { message, .. } if message.contains("DynamoDB was unreachable")),
        "{error}"
    );
    assert!(error.execution_ended());

    let endpoint = invoke_api(500, &[], body).await;
    let error = invoker(&endpoint).invoke("svc", &prepare()).await.unwrap_err();
    assert!(matches!(&error, InvokeError::Transport { .. }), "{error}");
    assert!(!error.execution_ended() && !error.never_ran());
}

#[tokio::test]
async fn an_answer_that_is_not_a_participant_response_is_refused() {
    let endpoint = invoke_api(200, &[], r#"{"vote": "MAYBE"}"#).await;
    let error = invoker(&endpoint).invoke("svc", &prepare()).await.unwrap_err();
    assert!(matches!(error, InvokeError::BadResponse { .. }), "{error}");
}
