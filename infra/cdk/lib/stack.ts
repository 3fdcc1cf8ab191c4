// The two-phase-commit system as a CDK stack: the same resources, parameters, conditions and outputs
// as the SAM template infra/template.yaml (the reference), with the same logical ids wherever CDK
// lets us choose them, so that the two synthesized templates read side by side and the same checks
// (infra/tests) run on both.
//
// What is written at a low level on purpose:
// - Every function has its own AWS::IAM::Role whose inline policy lists only what that function's
//   code calls, each on its own log group for logs (CfnRole). The functions get the role as an
//   immutable reference, so no construct can add a statement, a policy resource or a managed policy
//   to it. `grant*()` helpers are never used: they grant wider action sets than the code calls.
// - Stream event source mappings are CfnEventSourceMapping: the L2 event sources add grants of their
//   own (sqs:GetQueueAttributes, sqs:GetQueueUrl, ...) and, with an immutable role, a queue policy.
// - Log groups are explicit (LogGroup with retention from a parameter); never `logRetention` on a
//   function, which adds a custom-resource Lambda with a managed policy.
// - Values that come from parameters through conditions (reserved concurrency, tracing) are set with
//   property overrides: the L2 props only take literal values for them.

import {
  Aws,
  CfnCondition,
  CfnResource,
  CfnOutput,
  CfnParameter,
  CfnRule,
  Duration,
  Fn,
  RemovalPolicy,
  Stack,
  StackProps,
  Validations,
} from 'aws-cdk-lib';
import * as apigateway from 'aws-cdk-lib/aws-apigateway';
import * as apigatewayv2 from 'aws-cdk-lib/aws-apigatewayv2';
import * as cloudtrail from 'aws-cdk-lib/aws-cloudtrail';
import * as cloudwatch from 'aws-cdk-lib/aws-cloudwatch';
import * as dynamodb from 'aws-cdk-lib/aws-dynamodb';
import * as events from 'aws-cdk-lib/aws-events';
import * as targets from 'aws-cdk-lib/aws-events-targets';
import * as glue from 'aws-cdk-lib/aws-glue';
import * as iam from 'aws-cdk-lib/aws-iam';
import * as kms from 'aws-cdk-lib/aws-kms';
import * as firehose from 'aws-cdk-lib/aws-kinesisfirehose';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import * as logs from 'aws-cdk-lib/aws-logs';
import * as s3 from 'aws-cdk-lib/aws-s3';
import * as secretsmanager from 'aws-cdk-lib/aws-secretsmanager';
import * as sns from 'aws-cdk-lib/aws-sns';
import * as sqs from 'aws-cdk-lib/aws-sqs';
import * as wafv2 from 'aws-cdk-lib/aws-wafv2';
import { Construct } from 'constructs';

import { Binary, CodeSource, rustFunction } from './code';
import { binaryOf, ParticipantService, SERVICES, serviceOperations } from './services';

export interface TwoPhaseCommitStackProps extends StackProps {
  /** Where the functions' code comes from (lib/code.ts). */
  readonly code: CodeSource;
  /** The participant services (lib/services.ts). */
  readonly services?: readonly ParticipantService[];
  /**
   * The coordinator's SERVICE_OPERATIONS (JSON): each service's own operation schemas. Default:
   * infra/service-operations.json, read at synthesis (lib/services.ts, serviceOperations).
   */
  readonly serviceOperations?: string;
}

/** The alias every registry entry and invoke grant names. */
export const ALIAS_NAME = 'live';

// Cross-origin access to the REST API: functions/twopc/src/cors.rs (ALLOW_METHODS, ALLOW_HEADERS,
// MAX_AGE_SECONDS), which infra/tests holds both templates to.
const CORS_ALLOW_METHODS = ['GET', 'POST', 'OPTIONS'];
const CORS_ALLOW_HEADERS = [
  'Age-Token',
  'Authorization',
  'Content-Type',
  'Idempotency-Key',
  'Prefer',
  'X-Amz-Content-Sha256',
  'X-Amz-Date',
  'X-Amz-Security-Token',
];
const CORS_MAX_AGE_SECONDS = 600;

// The access logs' lines (JSON): the request, who called (the IAM caller; with JwtIssuer set the
// principal the authorizer passed on), the route, the status and the latency. The SAM template's, as written.
// The error message is free text: $context.error.messageString, which API Gateway writes quoted and escaped
// (never inside quotes of our own); the request path ($context.path) has no such form and is not logged.
const REST_ACCESS_LOG_FORMAT =
  '{"requestId":"$context.requestId","requestTime":"$context.requestTimeEpoch","sourceIp":"$context.identity.sourceIp",' +
  '"caller":"$context.identity.userArn","principal":"$context.authorizer.principal",' +
  '"route":"$context.httpMethod $context.resourcePath","status":"$context.status",' +
  '"latencyMs":"$context.responseLatency","integrationLatencyMs":"$context.integrationLatency",' +
  '"responseLength":"$context.responseLength","error":$context.error.messageString,"wafStatus":"$context.waf.status"}';
const WEBSOCKET_ACCESS_LOG_FORMAT =
  '{"requestId":"$context.requestId","requestTime":"$context.requestTimeEpoch","sourceIp":"$context.identity.sourceIp",' +
  '"caller":"$context.identity.userArn","principal":"$context.authorizer.principal","connectionId":"$context.connectionId",' +
  '"eventType":"$context.eventType","route":"$context.routeKey","status":"$context.status",' +
  '"latencyMs":"$context.integrationLatency","error":$context.error.messageString}';

// checkov's checks that do not apply, each with its one-line reason (infra/checkov.sh): the resource's
// Metadata `checkov: {skip: [{id, comment}]}`, as in the SAM template.
type Skip = readonly [string, string];
const skip = (resource: CfnResource, skips: readonly Skip[]) =>
  resource.addMetadata('checkov', { skip: skips.map(([id, comment]) => ({ id, comment })) });
const NO_VPC: Skip = [
  'CKV_AWS_117',
  'No VPC: it calls AWS APIs (the payments its payment API over HTTPS) and nothing private; a VPC adds NAT or endpoints, no protection',
];
const NO_SECRET_IN_ENVIRONMENT: Skip = [
  'CKV_AWS_173',
  'The environment holds names, ARNs and settings, no secret (the message keys are in Secrets Manager)',
];
const synchronous = (who: string): Skip => [
  'CKV_AWS_116',
  `Invoked synchronously by ${who}: a failure is answered to the caller, there is no event to dead-letter`,
];
const uncapped = (why: string): Skip => [
  'CKV_AWS_115',
  `No reserved concurrency: ${why} (infra/DEPLOY.md, Reserved concurrency)`,
];
const AWS_MANAGED_TABLE_KEY: Skip = [
  'CKV_AWS_119',
  "Encrypted at rest with DynamoDB's AWS-managed key (SSESpecification): no customer key to manage or grant",
];
const LOG_SERVICE_KEY: Skip = [
  'CKV_AWS_158',
  'Encrypted by CloudWatch Logs with its service key; a customer managed key would add a key policy to keep and no access control here',
];

const LOG_RETENTION_DAYS = [
  1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653,
];

/** A policy statement in CloudFormation's JSON shape (values may be tokens). */
type Statement = Record<string, unknown>;

interface TableSpec {
  readonly logicalId: string;
  readonly name: string;
  readonly hashKey: string;
  readonly rangeKey?: string;
  readonly index: { name: string; hashKey: [string, string]; rangeKey: [string, string] };
  readonly stream: boolean;
  readonly ttlAttribute?: string;
}

/** One participant deployment of the stack. */
interface Participant {
  readonly service: ParticipantService;
  readonly table: dynamodb.CfnTable;
  /** The service's message key (functions/twopc/src/auth.rs): its `Ref` is the secret's ARN. */
  readonly key: secretsmanager.CfnSecret;
  readonly function: lambda.Function;
  readonly alias: lambda.Alias;
}

/** The description of a service's message key: what it is and how to rotate it. */
const messageKeyDescription = (serviceName: string) =>
  `Message key of the 2PC participant service ${serviceName}: the coordinator and the sweeper sign every ` +
  'message to its participant with HMAC-SHA-256 under it, the participant verifies. Value {"id": "k1", ' +
  '"secret": "..."}. To rotate, put {"keys": [old key, {"id": "k2", "secret": "<new, 64 letters and ' +
  'digits>", "notBefore": <ms since the epoch, at least 60 s ahead>}]}, then remove the old key 120 s ' +
  'after that notBefore (infra/DEPLOY.md, Who may invoke a participant).';

const AGE_TOKEN_KEY_DESCRIPTION =
  'Age-token key of the 2PC coordinator: the coordinator alone signs and verifies age tokens with ' +
  'HMAC-SHA-256 under it. Value {"id": "k1", "secret": "..."}. To rotate, put {"keys": [old key, ' +
  '{"id": "k2", "secret": "<new, 64 letters and digits>", "notBefore": <ms since the epoch, at least 60 s ' +
  'ahead>}]}, then remove the old key 120 s after that notBefore (infra/DEPLOY.md, The coordinator\'s ' +
  'age-token key).';

export class TwoPhaseCommitStack extends Stack {
  constructor(scope: Construct, id: string, props: TwoPhaseCommitStackProps) {
    super(scope, id, props);
    const services = props.services ?? SERVICES;
    const operations = props.serviceOperations ?? serviceOperations();

    // ---------------------------------------------------------------------------------------------
    // Parameters and conditions: the SAM template's, with the same names, defaults and constraints.
    // ---------------------------------------------------------------------------------------------
    const parameter = (name: string, options: ConstructorParameters<typeof CfnParameter>[2]) =>
      new CfnParameter(this, name, options);

    const pendingCredits = parameter('PendingCredits', {
      type: 'String',
      default: 'on',
      allowedValues: ['on', 'off'],
      description:
        "Whether a keyed request's credits (a positive add with no guard) take pending entries instead of the " +
        "item's lock, so payments to one hot account prepare at once. Set \"off\" for the first deploy of an " +
        'upgrade from a version without them, "on" in the next (DEPLOY.md).',
    });
    const transactionsTableName = parameter('TransactionsTableName', {
      type: 'String',
      default: 'transactions',
      allowedPattern: '[a-zA-Z0-9_.-]{3,255}',
      description: "Name of the transactions table (the coordinator's log of decisions).",
    });
    const connectionsTableName = parameter('ConnectionsTableName', {
      type: 'String',
      default: 'connections',
      allowedPattern: '[a-zA-Z0-9_.-]{3,255}',
      description: 'Name of the WebSocket connections and subscriptions table.',
    });
    // A service with a fixed name (its operation schemas are keyed by it) has no name parameter.
    const serviceParameters = services.map((service, i) => ({
      service,
      name: service.fixedName
        ? service.defaultName
        : parameter(`Service${service.key}Name`, {
            type: 'String',
            default: service.defaultName,
            allowedPattern: '[a-zA-Z0-9_.-]{1,64}',
            description:
              i === 0
                ? 'Registry name of the first participant service (what clients put in "service").'
                : `Registry name of the ${service.ordinal} participant service.`,
          }).valueAsString,
      tableName: parameter(`Service${service.key}TableName`, {
        type: 'String',
        default: service.defaultTableName,
        allowedPattern: '[a-zA-Z0-9_.-]{3,255}',
        description: `Data table owned by the ${service.ordinal} participant service.`,
      }),
      // A resource participant's resource (the example payments: its payment API's URL).
      resourceAddress: service.resource
        ? parameter(service.resource.parameter, {
            type: 'String',
            default: service.resource.default,
            allowedPattern: service.resource.allowedPattern,
            constraintDescription: service.resource.constraintDescription,
            description: service.resource.description,
          })
        : undefined,
    }));
    const apiStageName = parameter('ApiStageName', {
      type: 'String',
      default: 'prod',
      allowedPattern: '[a-zA-Z0-9_]{1,128}',
      description: 'Stage of the REST API.',
    });
    const webSocketStageName = parameter('WebSocketStageName', {
      type: 'String',
      default: 'prod',
      allowedPattern: '[a-zA-Z0-9_]{1,128}',
      description: 'Stage of the WebSocket API.',
    });
    const logLevel = parameter('LogLevel', {
      type: 'String',
      default: 'INFO',
      allowedValues: ['TRACE', 'DEBUG', 'INFO', 'WARN', 'ERROR', 'FATAL'],
      description:
        'Application log level of every function (LoggingConfig.ApplicationLogLevel; Lambda passes it to ' +
        'the code as AWS_LAMBDA_LOG_LEVEL).',
    });
    const logRetentionInDays = parameter('LogRetentionInDays', {
      type: 'Number',
      // A string, as the allowed values are: cfn-lint compares them as written.
      default: '30',
      allowedValues: LOG_RETENTION_DAYS.map(String),
      description: "Retention of the functions' log groups.",
    });
    const alarmActionArn = parameter('AlarmActionArn', {
      type: 'String',
      default: '',
      description:
        'SNS topic ARN every alarm notifies; empty (the default): the stack creates its own topic, encrypted ' +
        'with a KMS key of its own (output AlarmTopicArn; subscribe to it, infra/DEPLOY.md "Alarms").',
    });
    const tracingMode = parameter('TracingMode', {
      type: 'String',
      default: 'PassThrough',
      allowedValues: ['PassThrough', 'Active'],
      description:
        'X-Ray tracing of every function and of the REST API stage (Active), or only of requests that ' +
        'arrive already sampled (PassThrough, no X-Ray permissions granted).',
    });
    const apiThrottlingRateLimit = parameter('ApiThrottlingRateLimit', {
      type: 'Number',
      default: 100,
      minValue: 0,
      description: 'Steady-state requests per second of each API stage (REST methods, WebSocket routes).',
    });
    const apiThrottlingBurstLimit = parameter('ApiThrottlingBurstLimit', {
      type: 'Number',
      default: 200,
      minValue: 0,
      description: 'Burst of requests of each API stage (REST methods, WebSocket routes).',
    });
    const coordinatorReservedConcurrency = parameter('CoordinatorReservedConcurrency', {
      type: 'Number',
      default: 100,
      minValue: 0,
      description:
        'Concurrency reserved for (and the cap of) the coordinator; 0 for no reservation (for accounts ' +
        'whose concurrency quota is too low to reserve).',
    });
    const sweeperReservedConcurrency = parameter('SweeperReservedConcurrency', {
      type: 'Number',
      default: 2,
      minValue: 0,
      description: 'Concurrency reserved for the sweeper; 0 for no reservation.',
    });
    const streamProcessorReservedConcurrency = parameter('StreamProcessorReservedConcurrency', {
      type: 'Number',
      default: 10,
      minValue: 0,
      description: 'Concurrency reserved for the stream processor; 0 for no reservation.',
    });
    // The sweeper's "Transaction Open Too Long" alerts on the outcomes bus (infra/DEPLOY.md, "Outcome
    // events"): its OPEN_ALERT_AFTER_MS.
    const openAlertAfterMs = parameter('OpenAlertAfterMs', {
      type: 'Number',
      default: 900000,
      minValue: 60000,
      description:
        'How long past its deadline (a held one\'s: its holdUntil) an open transaction may stay, in ' +
        'milliseconds, before each sweep run sends a "Transaction Open Too Long" event for it to the outcomes event bus (the sweeper\'s OPEN_ALERT_AFTER_MS; default ' +
        "900000, 15 minutes; at least 60000, the sweeper's one-minute period). Consumers deduplicate the " +
        'repeated alerts of one transaction by detail.outcomeId.',
    });
    const lakeDatabaseName = parameter('LakeDatabaseName', {
      type: 'String',
      default: 'twopc_lake',
      allowedPattern: '[a-z0-9_]{1,255}',
      description: "Glue (Athena) database of the lake's table `changes`.",
    });
    const corsAllowOrigin = parameter('CorsAllowOrigin', {
      type: 'String',
      default: '*',
      // One origin as browsers send it (no list, no path, no trailing slash), or any.
      allowedPattern: '\\*|https?://[A-Za-z0-9.:\\[\\]-]+',
      description:
        'The origin browsers may call the REST API from: * (any) or one origin such as ' +
        'https://app.example.com (scheme, host and port, no path). Requests must be signed (SigV4) or carry a JWT anyway.',
    });
    const maxTopicsPerConnection = parameter('MaxTopicsPerConnection', {
      type: 'Number',
      // functions/fanout/src/connections.rs, DEFAULT_MAX_TOPICS_PER_CONNECTION (infra/tests reads it there).
      default: 50,
      minValue: 1,
      maxValue: 1000,
      description:
        "How many topics one WebSocket connection may follow at once (the connections function's " +
        'MAX_TOPICS_PER_CONNECTION); a subscribe beyond it is refused topic by topic, with the reason.',
    });
    // Held transactions (`holdMs`, docs/protocol.md, "Decide later: held transactions"): the coordinator's
    // HOLD_POLICY and MAX_HOLD_MS (functions/twopc/src/hold.rs; infra/tests reads the bounds and the
    // defaults in functions/twopc/src/model/request.rs).
    const holdPolicy = parameter('HoldPolicy', {
      type: 'String',
      default: '{}',
      // A JSON object; the coordinator checks the rest and refuses to start on a bad one.
      allowedPattern: '\\s*\\{.*\\}\\s*',
      constraintDescription:
        'must be a JSON object such as {"service-a": {"maxHoldMs": 600000}, "service-b": {"accepts": false}}',
      description:
        'Which services accept held transactions (holdMs) and the longest hold each accepts, as JSON ' +
        '{"<service>": {"accepts"?: true|false, "maxHoldMs"?: milliseconds}} (the coordinator\'s ' +
        'HOLD_POLICY), for example {"service-a": {"maxHoldMs": 600000}, "service-b": {"accepts": false}}. ' +
        'A service not named accepts holds of up to 15 minutes; {} (the default): every service does. ' +
        'A held transaction keeps its locks until its caller commits or aborts it, or the hold expires.',
    });
    const maxHoldMs = parameter('MaxHoldMs', {
      type: 'Number',
      // functions/twopc/src/model/request.rs: DEFAULT_MAX_HOLD_MS (24 h, the default and the ceiling), MIN_HOLD_MS.
      default: 86400000,
      minValue: 1000,
      maxValue: 86400000,
      description:
        "The longest hold of any held transaction, in milliseconds (the coordinator's MAX_HOLD_MS), 1000 " +
        "to 86400000 (24 h); each service's own maximum (HoldPolicy) applies below it.",
    });

    // How the coordinator and the sweeper sign participant messages (docs/participant-protocol.md; the
    // order of a switch: infra/DEPLOY.md, "Moving participant messages to signature v2").
    const participantSignature = parameter('ParticipantSignature', {
      type: 'String',
      default: 'v1',
      allowedValues: ['v1', 'v2'],
      description:
        'How the coordinator and the sweeper sign participant messages (their PARTICIPANT_SIGNATURE): v1, ' +
        'the signature inside the message over a canonical form of it, or v2, an envelope whose MAC covers ' +
        'the message\'s bytes as sent. Every participant verifies both; choose v2 once every participant ' +
        'runs a version that does.',
    });

    // Who may call (infra/DEPLOY.md, "Authorization"): AWS IAM (SigV4-signed requests) unless JwtIssuer
    // is set; then both APIs take JSON Web Tokens of that issuer, checked by the authorizer function
    // (functions/authorizer) before a request reaches the coordinator or a WebSocket connects. What
    // each caller may then do (the owner of each item, admins) is the AccessPolicy's.
    const jwtIssuer = parameter('JwtIssuer', {
      type: 'String',
      default: '',
      // Empty, or the issuer URL exactly as in the tokens' `iss`.
      allowedPattern: '(https://[^\\s]+)?',
      constraintDescription: "empty, or an https:// URL (the tokens' iss, exactly)",
      description:
        'Empty (the default): both APIs are IAM-authorized (SigV4-signed requests), no authorizer is ' +
        'deployed. Set: both APIs take JSON Web Tokens of this issuer instead (REST: every method, the ' +
        'Authorization header; WebSocket: $connect, the `token` query parameter or the Authorization ' +
        "header), checked by the authorizer function against the issuer's keys (JwksUrl, by default " +
        "<JwtIssuer>/.well-known/jwks.json). Exactly the tokens' iss: for a Cognito user pool " +
        'https://cognito-idp.<region>.amazonaws.com/<poolId>; any OIDC issuer otherwise.',
    });
    const jwtAudience = parameter('JwtAudience', {
      type: 'String',
      default: '',
      allowedPattern: '[^\\s]*',
      constraintDescription: 'no spaces',
      description:
        'The audience the tokens must carry (their aud; for a Cognito ID token the app client id). ' +
        'Required when JwtIssuer is set, unused otherwise.',
    });
    const jwksUrl = parameter('JwksUrl', {
      type: 'String',
      default: '',
      allowedPattern: '(https://[^\\s]+)?',
      constraintDescription: 'empty, or an https:// URL',
      description:
        "Where the issuer's signing keys (JWKS) are, when not at <JwtIssuer>/.well-known/jwks.json (the " +
        "default when empty: Cognito's and most OIDC issuers'; otherwise the jwks_uri of the issuer's " +
        '/.well-known/openid-configuration). Unused without JwtIssuer.',
    });
    const accessPolicy = parameter('AccessPolicy', {
      type: 'String',
      // The example wallets' balances are what non-admins may credit (rename the services here when you
      // rename ServiceAName or ServiceBName); {} allows no credits.
      default: '{"allowCredits": {"service-a": ["balance"], "service-b": ["balance"]}}',
      // A JSON object; the functions check the rest and refuse to start on a bad one.
      allowedPattern: '\\s*\\{.*\\}\\s*',
      constraintDescription:
        'must be a JSON object such as {"adminGroups": ["admins"], "allowCredits": {"service-a": ["balance"]}}',
      description:
        'Who may do what, as JSON (the ACCESS_POLICY of the coordinator, the connections function, the ' +
        'stream processor and the authorizer), every field optional: {"adminGroups": [groups whose ' +
        'members are admins (cognito:groups or groups claim)], "adminClaim": "<claim that is true for an ' +
        'admin>", "iamAdmins": ["*" (the default: every IAM principal) or role names or ARNs], ' +
        '"allowCredits": {"<service>": [fields non-admins may credit (add a positive delta) on items they ' +
        'do not own], ...} (the boolean of older versions still works, deprecated: true is any field of the ' +
        'services in writeServices), ' +
        '"readTables": null (every table) or [tables whose owned items a non-admin may read and follow], ' +
        '"writeServices": null (every service) or [services whose owned items a non-admin may write], ' +
        '"operators": [IAM role names or ARNs that may use the operators\' API /admin; none by default, and ' +
        'an admin is not one], "operatorGroups": [JWT groups whose members are operators]}. ' +
        'The default names the example wallets\' balances; {}: the code\'s defaults, which allow no credits ' +
        '(infra/DEPLOY.md, "Authorization").',
    });
    const maxConnectionsPerPrincipal = parameter('MaxConnectionsPerPrincipal', {
      type: 'Number',
      default: 10,
      minValue: 1,
      maxValue: 1000,
      description:
        'How many WebSocket connections one caller (IAM principal or JWT subject) may hold open at once ' +
        "(the connections function's MAX_CONNECTIONS_PER_PRINCIPAL); a $connect beyond it is refused.",
    });
    // Access logs of both API stages go to CloudWatch Logs through API Gateway's account-level role (one
    // per account and region, in API Gateway's account settings): Create makes that role and sets it
    // (AWS::ApiGateway::Account; the role is retained when the stack is deleted, since the setting
    // outlives the stack); Existing leaves the account settings alone (they must already name a role).
    const apiGatewayAccountRole = parameter('ApiGatewayAccountRole', {
      type: 'String',
      default: 'Create',
      allowedValues: ['Create', 'Existing'],
      description:
        "Create (the default): the stack creates API Gateway's CloudWatch Logs role and sets it in the " +
        "account's API Gateway settings of this region (needed for the stages' access logs). Existing: the " +
        'account settings already name one (aws apigateway get-account shows cloudwatchRoleArn); the stack ' +
        'does not touch them.',
    });
    // Who read or wrote the lake's objects: S3 server access logs (best effort, minutes late, no extra
    // cost but storage) or CloudTrail data events (complete, with the caller's identity, charged per
    // event), both delivered to the audit bucket.
    const lakeAccessLogging = parameter('LakeAccessLogging', {
      type: 'String',
      default: 'S3ServerAccessLogs',
      allowedValues: ['S3ServerAccessLogs', 'CloudTrailDataEvents'],
      description:
        "How access to the lake bucket is logged into the stack's audit bucket: S3ServerAccessLogs (S3 " +
        "server access logs) or CloudTrailDataEvents (a trail of the lake's object-level data events).",
    });
    // An AWS WAF web ACL in front of the REST stage: a rate-based rule per client IP and AWS's known bad
    // inputs rule group, its requests logged.
    const wafEnabled = parameter('WafEnabled', {
      type: 'String',
      default: 'false',
      allowedValues: ['true', 'false'],
      description:
        "true: an AWS WAF web ACL is associated with the REST API's stage, blocking a client IP above " +
        "WafRateLimit requests per 5 minutes and AWS's known bad inputs (WAF is charged per ACL, rule and " +
        'request).',
    });
    const wafRateLimit = parameter('WafRateLimit', {
      type: 'Number',
      default: 2000,
      minValue: 100,
      maxValue: 2000000000,
      description:
        'With WafEnabled: the requests one client IP may make to the REST API in any 5 minutes before WAF ' +
        'blocks it (until its rate falls below the limit).',
    });
    // A token is only accepted for its audience: an issuer without one is refused at deploy time here
    // rather than by the authorizer at its first request.
    new CfnRule(this, 'JwtAudienceWithIssuer', {
      ruleCondition: Fn.conditionNot(Fn.conditionEquals(jwtIssuer.valueAsString, '')),
      assertions: [
        {
          assert: Fn.conditionNot(Fn.conditionEquals(jwtAudience.valueAsString, '')),
          assertDescription:
            "JwtAudience must be set when JwtIssuer is (the tokens' aud; for a Cognito ID token the app client id)",
        },
      ],
    });

    // No topic given: the stack creates one (AlarmTopic) and every alarm notifies it.
    const createAlarmTopic = new CfnCondition(this, 'CreateAlarmTopic', {
      expression: Fn.conditionEquals(alarmActionArn.valueAsString, ''),
    });
    const createApiGatewayAccount = new CfnCondition(this, 'CreateApiGatewayAccount', {
      expression: Fn.conditionEquals(apiGatewayAccountRole.valueAsString, 'Create'),
    });
    const lakeServerAccessLogs = new CfnCondition(this, 'LakeServerAccessLogs', {
      expression: Fn.conditionEquals(lakeAccessLogging.valueAsString, 'S3ServerAccessLogs'),
    });
    const lakeCloudTrail = new CfnCondition(this, 'LakeCloudTrail', {
      expression: Fn.conditionEquals(lakeAccessLogging.valueAsString, 'CloudTrailDataEvents'),
    });
    const useWaf = new CfnCondition(this, 'UseWaf', {
      expression: Fn.conditionEquals(wafEnabled.valueAsString, 'true'),
    });
    const tracingActive = new CfnCondition(this, 'TracingActive', {
      expression: Fn.conditionEquals(tracingMode.valueAsString, 'Active'),
    });
    const reservation = (name: string, value: CfnParameter) =>
      new CfnCondition(this, name, {
        expression: Fn.conditionNot(Fn.conditionEquals(value.valueAsString, '0')),
      });
    const reserveCoordinator = reservation('ReserveCoordinatorConcurrency', coordinatorReservedConcurrency);
    const reserveSweeper = reservation('ReserveSweeperConcurrency', sweeperReservedConcurrency);
    const reserveStreamProcessor = reservation('ReserveStreamProcessorConcurrency', streamProcessorReservedConcurrency);
    // JSON Web Tokens instead of IAM: the authorizer function and its wiring exist only then.
    const useJwt = new CfnCondition(this, 'UseJwt', {
      expression: Fn.conditionNot(Fn.conditionEquals(jwtIssuer.valueAsString, '')),
    });
    /** `whenJwt` when JwtIssuer is set, else `otherwise`. */
    const ifJwt = (whenJwt: unknown, otherwise: unknown) => Fn.conditionIf(useJwt.logicalId, whenJwt, otherwise);

    /** `value` when the condition holds, else no value (the property or list item is left out). */
    const ifElseNothing = (condition: CfnCondition, value: unknown) =>
      Fn.conditionIf(condition.logicalId, value, Aws.NO_VALUE);

    // ---------------------------------------------------------------------------------------------
    // Tables: exactly the code's (functions/twopc/src/tables.rs, printed by
    // `cargo run -q -p twopc --example contract`; infra/tests compares them).
    // ---------------------------------------------------------------------------------------------
    const table = (spec: TableSpec) => {
      const attributes = new Map<string, string>([[spec.hashKey, 'S']]);
      if (spec.rangeKey) attributes.set(spec.rangeKey, 'S');
      attributes.set(spec.index.hashKey[0], spec.index.hashKey[1]);
      attributes.set(spec.index.rangeKey[0], spec.index.rangeKey[1]);
      const resource = new dynamodb.CfnTable(this, spec.logicalId, {
        tableName: spec.name,
        billingMode: 'PAY_PER_REQUEST',
        attributeDefinitions: [...attributes].map(([attributeName, attributeType]) => ({ attributeName, attributeType })),
        keySchema: [
          { attributeName: spec.hashKey, keyType: 'HASH' },
          ...(spec.rangeKey ? [{ attributeName: spec.rangeKey, keyType: 'RANGE' }] : []),
        ],
        globalSecondaryIndexes: [
          {
            indexName: spec.index.name,
            keySchema: [
              { attributeName: spec.index.hashKey[0], keyType: 'HASH' },
              { attributeName: spec.index.rangeKey[0], keyType: 'RANGE' },
            ],
            projection: { projectionType: 'KEYS_ONLY' },
          },
        ],
        streamSpecification: spec.stream ? { streamViewType: 'NEW_AND_OLD_IMAGES' } : undefined,
        timeToLiveSpecification: spec.ttlAttribute ? { attributeName: spec.ttlAttribute, enabled: true } : undefined,
        pointInTimeRecoverySpecification: { pointInTimeRecoveryEnabled: true },
        sseSpecification: { sseEnabled: true },
        // Neither a console click nor an API call deletes the table (nor, with Retain, a stack
        // deletion or a replacement).
        deletionProtectionEnabled: true,
      });
      resource.applyRemovalPolicy(RemovalPolicy.RETAIN);
      skip(resource, [AWS_MANAGED_TABLE_KEY]);
      return resource;
    };
    const transactionsTable = table({
      logicalId: 'TransactionsTable',
      name: transactionsTableName.valueAsString,
      hashKey: 'transactionId',
      index: { name: 'open-transactions', hashKey: ['openShard', 'S'], rangeKey: ['sweepAt', 'N'] },
      stream: true,
      ttlAttribute: 'expireAt',
    });
    const connectionsTable = table({
      logicalId: 'ConnectionsTable',
      name: connectionsTableName.valueAsString,
      hashKey: 'connectionId',
      rangeKey: 'topic',
      index: { name: 'by-topic', hashKey: ['topic', 'S'], rangeKey: ['connectionId', 'S'] },
      stream: false,
      ttlAttribute: 'expireAt',
    });
    const dataTables = serviceParameters.map(({ service, tableName }) =>
      table({
        logicalId: `Service${service.key}Table`,
        name: tableName.valueAsString,
        hashKey: 'entityId',
        index: { name: 'locks-by-expiry', hashKey: ['lockShard', 'S'], rangeKey: ['lockExpiresAt', 'N'] },
        stream: true,
        // A resource's finished barrier entries expire (functions/twopc/src/participant/barrier.rs).
        ttlAttribute: 'expireAt',
      }),
    );
    const indexArn = (t: dynamodb.CfnTable, index: string) => `${t.attrArn}/index/${index}`;

    // ---------------------------------------------------------------------------------------------
    // Log groups: one per function, so that each role may write to its own log group only.
    // ---------------------------------------------------------------------------------------------
    const logGroup = (logicalId: string, name: string) => {
      const group = new logs.LogGroup(this, logicalId, {
        logGroupName: name,
        retention: logRetentionInDays.valueAsNumber as logs.RetentionDays,
        removalPolicy: RemovalPolicy.DESTROY,
      });
      const resource = group.node.defaultChild as logs.CfnLogGroup;
      resource.overrideLogicalId(logicalId);
      skip(resource, [LOG_SERVICE_KEY]);
      return group;
    };
    const functionLogGroup = (logicalId: string, suffix: string) =>
      logGroup(logicalId, `/aws/lambda/${Aws.STACK_NAME}/${suffix}`);

    // API Gateway writes access logs with the account's CloudWatch Logs role (API Gateway's account
    // settings, one per account and region, shared by every API there). Only with
    // ApiGatewayAccountRole=Create. The role may write to the log groups of this account and region only
    // (the setting serves every API of the region, so no narrower): create, describe and write, never read
    // (the managed AmazonAPIGatewayPushToCloudWatchLogs adds GetLogEvents and FilterLogEvents, which API
    // Gateway never calls). It is retained when the stack goes, as the setting that names it stays.
    const apiGatewayCloudWatchRole = new iam.CfnRole(this, 'ApiGatewayCloudWatchRole', {
      description: "API Gateway's CloudWatch Logs role (account settings) for the access logs of this region's APIs",
      assumeRolePolicyDocument: {
        Version: '2012-10-17',
        Statement: [{ Effect: 'Allow', Principal: { Service: 'apigateway.amazonaws.com' }, Action: 'sts:AssumeRole' }],
      },
      policies: [
        {
          policyName: 'api-gateway-logs',
          policyDocument: {
            Version: '2012-10-17',
            Statement: [
              {
                Sid: 'ApiGatewayLogs',
                Effect: 'Allow',
                Action: [
                  'logs:CreateLogGroup',
                  'logs:CreateLogStream',
                  'logs:DescribeLogGroups',
                  'logs:DescribeLogStreams',
                  'logs:PutLogEvents',
                ],
                Resource: `arn:${Aws.PARTITION}:logs:${Aws.REGION}:${Aws.ACCOUNT_ID}:log-group:*`,
              },
            ],
          },
        },
      ],
    });
    apiGatewayCloudWatchRole.cfnOptions.condition = createApiGatewayAccount;
    apiGatewayCloudWatchRole.applyRemovalPolicy(RemovalPolicy.RETAIN);
    const apiGatewayAccount = new apigateway.CfnAccount(this, 'ApiGatewayAccount', {
      cloudWatchRoleArn: apiGatewayCloudWatchRole.attrArn,
    });
    apiGatewayAccount.cfnOptions.condition = createApiGatewayAccount;
    apiGatewayAccount.applyRemovalPolicy(RemovalPolicy.RETAIN);
    // Access logs of the two API stages (JSON, one line per request; infra/DEPLOY.md, "Access logs").
    // The tag names the account settings the stack sets (ApiGatewayAccountRole=Create), so that
    // CloudFormation sets them before a stage that logs here is created.
    const accessLogGroup = (logicalId: string, suffix: string) => {
      const group = logGroup(logicalId, `/aws/apigateway/${Aws.STACK_NAME}/${suffix}`);
      (group.node.defaultChild as logs.CfnLogGroup).addPropertyOverride('Tags', [
        {
          Key: 'twopc:api-gateway-account',
          Value: Fn.conditionIf(createApiGatewayAccount.logicalId, apiGatewayAccount.ref, 'existing'),
        },
      ]);
      return group;
    };
    const restApiAccessLogGroup = accessLogGroup('RestApiAccessLogGroup', 'rest-access');
    const webSocketAccessLogGroup = accessLogGroup('WebSocketAccessLogGroup', 'websocket-access');

    // ---------------------------------------------------------------------------------------------
    // Roles (one per function, inline least-privilege policy) and functions (provided.al2023 on
    // arm64, JSON logs at the LogLevel parameter's level into their own log group, tracing from
    // TracingMode).
    // ---------------------------------------------------------------------------------------------
    const lambdaRole = (logicalId: string, policyName: string, ownLogGroup: logs.LogGroup, statements: Statement[]) =>
      new iam.CfnRole(this, logicalId, {
        assumeRolePolicyDocument: {
          Version: '2012-10-17',
          Statement: [{ Effect: 'Allow', Principal: { Service: 'lambda.amazonaws.com' }, Action: 'sts:AssumeRole' }],
        },
        policies: [
          {
            policyName,
            policyDocument: {
              Version: '2012-10-17',
              Statement: [
                {
                  Sid: 'OwnLogGroup',
                  Effect: 'Allow',
                  Action: ['logs:CreateLogStream', 'logs:PutLogEvents'],
                  Resource: ownLogGroup.logGroupArn,
                },
                // X-Ray segments, only when TracingMode is Active (X-Ray defines no resource types
                // for these two: "*" is the only resource they take). In the role itself, so that the
                // permission exists before Lambda checks it when the function is created or updated.
                ifElseNothing(tracingActive, {
                  Sid: 'Tracing',
                  Effect: 'Allow',
                  Action: ['xray:PutTraceSegments', 'xray:PutTelemetryRecords'],
                  Resource: '*',
                }),
                ...statements,
              ],
            },
          },
        ],
      });

    const rust = (
      logicalId: string,
      binary: Binary,
      role: iam.CfnRole,
      group: logs.LogGroup,
      options: {
        description: string;
        timeout?: number;
        memorySize?: number;
        environment: Record<string, string>;
        reservedConcurrency?: [CfnCondition, CfnParameter];
        /** checkov's checks that do not apply, beyond the VPC and the environment's encryption. */
        skips: readonly Skip[];
      },
    ) => {
      const f = rustFunction(this, logicalId, props.code, binary, {
        description: options.description,
        // The role above holds exactly the grants the code needs; as an immutable reference no
        // construct can add statements or managed policies to it.
        role: iam.Role.fromRoleArn(this, `${logicalId}RoleRef`, role.attrArn, { mutable: false }),
        memorySize: options.memorySize ?? 256,
        timeout: Duration.seconds(options.timeout ?? 10),
        environment: options.environment,
        loggingFormat: lambda.LoggingFormat.JSON,
        applicationLogLevelV2: logLevel.valueAsString as lambda.ApplicationLogLevel,
        systemLogLevelV2: lambda.SystemLogLevel.WARN,
        logGroup: group,
      });
      const resource = f.node.defaultChild as lambda.CfnFunction;
      resource.overrideLogicalId(logicalId);
      skip(resource, [...options.skips, NO_VPC, NO_SECRET_IN_ENVIRONMENT]);
      resource.addPropertyOverride('TracingConfig', { Mode: tracingMode.valueAsString });
      if (options.reservedConcurrency) {
        const [condition, value] = options.reservedConcurrency;
        resource.addPropertyOverride('ReservedConcurrentExecutions', ifElseNothing(condition, value.valueAsNumber));
      }
      return f;
    };

    // Reading, creating and moving transaction records: the coordinator.
    const transactionRecords: Statement = {
      Sid: 'TransactionRecords',
      Effect: 'Allow',
      Action: ['dynamodb:GetItem', 'dynamodb:PutItem', 'dynamodb:UpdateItem'],
      Resource: transactionsTable.attrArn,
    };
    /** IAM refuses a PutItem or UpdateItem naming any of these attributes (dynamodb:Attributes: every
     * attribute the request names, the item's for a put, the expressions' for an update). */
    const refusingAttributes = (attributes: string[]) => ({
      'ForAllValues:StringNotEquals': { 'dynamodb:Attributes': attributes },
    });
    // The attributes the coordinator alone writes: who created a transaction, its idempotency hash, its
    // execution, its hold, a retried attempt's age and chain (issue 35), the operators' audit (issue 47).
    const coordinatorOnly = ['principal', 'requestHash', 'executionId', 'holdMs', 'holdUntil', 'startedAt', 'attempt', 'firstTransactionId', 'retriedAs', 'refusedForContention', 'ageClaimedBy', 'ageOf', 'bodyHash', 'audit'];

    // --- participants: one deployment (function + role + log group + table + key) per service, each
    // running the generic participant or the service's own (the participant library with its own
    // operations, as the example inventory, or driving a resource, as the example payments) ----------
    const participants: Participant[] = serviceParameters.map(({ service, name, resourceAddress }, i) => {
      const own = dataTables[i];
      // The service's message key (functions/twopc/src/auth.rs): the coordinator and the sweeper sign
      // every message to this participant with HMAC-SHA-256 under it, the participant verifies it before
      // it does anything. CloudFormation generates the value once, {"id": "k1", "secret": <64 letters
      // and digits>}, encrypted with the AWS-managed key aws/secretsmanager (no KMS grant needed).
      // Rotate by hand as infra/DEPLOY.md says; never change generateSecretString (CloudFormation would
      // generate a new value at the next deploy, replacing the key set at once).
      const key = new secretsmanager.CfnSecret(this, `Service${service.key}MessageKey`, {
        description: messageKeyDescription(name),
        generateSecretString: {
          secretStringTemplate: '{"id":"k1"}',
          generateStringKey: 'secret',
          passwordLength: 64,
          excludePunctuation: true,
        },
      });
      skip(key, [
        [
          'CKV_AWS_149',
          'Under the AWS-managed key aws/secretsmanager by design: no key policy or grant to keep (infra/DEPLOY.md, Who may invoke a participant)',
        ],
      ]);
      const group = functionLogGroup(`Participant${service.key}LogGroup`, `participant-${name}`);
      const tables: Statement[] = service.resource
        ? [
            // A resource participant touches no item and no transaction record: what
            // functions/twopc/src/participant/barrier.rs (the barrier) calls: GetItem (read an entry),
            // PutItem (the first entry of a transaction, conditional), UpdateItem (its moves).
            {
              Sid: 'OwnDataTable',
              Effect: 'Allow',
              Action: ['dynamodb:GetItem', 'dynamodb:PutItem', 'dynamodb:UpdateItem'],
              Resource: own.attrArn,
            },
          ]
        : [
            // What functions/twopc/src/participant/store.rs calls: GetItem, BatchGetItem (prepare reads),
            // UpdateItem (locks, commits, releases), DeleteItem (commit of a delete), ConditionCheckItem (a
            // `check` in a one-phase commit). TransactWriteItems is authorized per item.
            {
              Sid: 'OwnDataTable',
              Effect: 'Allow',
              Action: [
                'dynamodb:GetItem',
                'dynamodb:BatchGetItem',
                'dynamodb:UpdateItem',
                'dynamodb:DeleteItem',
                'dynamodb:ConditionCheckItem',
              ],
              Resource: own.attrArn,
            },
            // Reading records: lock resolution follows a lock's owner (roll forward a commit, release an
            // abort; one past its deadline is decided by the coordinator or the sweeper, never here).
            {
              Sid: 'ReadTransactionRecords',
              Effect: 'Allow',
              Action: 'dynamodb:GetItem',
              Resource: transactionsTable.attrArn,
            },
            // The one-phase commit puts its COMMITTED record in the same TransactWriteItems as the items,
            // and only under its own service's one-phase ids (`1p~<service>~...`,
            // twopc::coordinator::one_phase_id): it can write the record of its own one-phase commits and
            // no other transaction's record, so no decision of a transaction of several participants.
            {
              Sid: 'OwnOnePhaseRecords',
              Effect: 'Allow',
              Action: 'dynamodb:PutItem',
              Resource: transactionsTable.attrArn,
              Condition: { 'ForAllValues:StringLike': { 'dynamodb:LeadingKeys': [`1p~${name}~*`] } },
            },
          ];
      const role = lambdaRole(`Participant${service.key}Role`, 'participant', group, [
        ...tables,
        // Its own service's message key, to verify the messages it receives (no other service's).
        { Sid: 'OwnMessageKey', Effect: 'Allow', Action: 'secretsmanager:GetSecretValue', Resource: key.ref },
      ]);
      // No reserved concurrency: the coordinator calls participants, a cap would refuse its bursts.
      const f = rust(`Participant${service.key}Function`, binaryOf(service), role, group, {
        description: `2PC participant for ${name}`,
        skips: [
          synchronous('the coordinator and the sweeper (RequestResponse), which retry'),
          uncapped('the coordinator calls participants, a cap would turn its bursts into refused prepares'),
        ],
        // A resource participant's slowest path (a prepare retrying its resource until the deadline)
        // is longer than the other participants' (10 s).
        timeout: service.resource?.timeout,
        environment: {
          SERVICE_NAME: name,
          DATA_TABLE_NAME: own.ref,
          // On for payments to one account to prepare at once; off for an upgrade's first deploy.
          PENDING_CREDITS: pendingCredits.valueAsString,
          TRANSACTIONS_TABLE_NAME: transactionsTable.ref,
          // Its own service's message key (the ARN of its secret): every message must be signed with it.
          PARTICIPANT_KEY: key.ref,
          // Its resource's address (the payments: PAYMENT_API_URL, HTTPS over the internet, no VPC).
          ...(service.resource && resourceAddress
            ? { [service.resource.variable]: resourceAddress.valueAsString }
            : {}),
        },
      });
      // Each deploy publishes a version and moves the alias `live` to it (SAM: AutoPublishAlias).
      // The registries and the invoke grants name the alias, so CloudFormation updates this function
      // (and moves `live`) before the coordinator and the sweeper.
      const aliasId = `Participant${service.key}FunctionAlias${ALIAS_NAME}`;
      const alias = new lambda.Alias(this, aliasId, { aliasName: ALIAS_NAME, version: f.currentVersion });
      (alias.node.defaultChild as lambda.CfnAlias).overrideLogicalId(aliasId);
      return { service, table: own, key, function: f, alias };
    });

    /** `{"<service name>": "<value>", ...}` over the participants, as a Fn::Sub like SAM's (a fixed
     * name is written as it is). */
    const perService = (value: (p: Participant) => string) =>
      Fn.sub(
        `{${participants
          .map((p) => `"${p.service.fixedName ? p.service.defaultName : `\${Service${p.service.key}Name}`}": "\${Service${p.service.key}}"`)
          .join(', ')}}`,
        Object.fromEntries(participants.map((p) => [`Service${p.service.key}`, value(p)])),
      );
    // The registry names each participant's `live` alias (its ARN): Lambda Invoke takes it as is.
    const registry = perService((p) => p.alias.functionArn);
    const participantTables = perService((p) => p.table.ref);
    // Each service's message key (the ARN of its secret), which signs every message to its participant:
    // the same services as the registry.
    const participantKeys = perService((p) => p.key.ref);
    const metricsNamespace = `TwoPhaseCommit/${Aws.STACK_NAME}`;
    // The participants' `live` aliases (the ARN of each alias), as the registry names them.
    const invokeRegisteredParticipants: Statement = {
      Sid: 'RegisteredParticipants',
      Effect: 'Allow',
      Action: 'lambda:InvokeFunction',
      Resource: participants.map((p) => p.alias.functionArn),
    };
    // Every registered service's message key (its secret), to sign the messages to its participant
    // (twopc::auth, SecretsManagerKeys; PARTICIPANT_KEYS names the same secrets).
    const readParticipantKeys: Statement = {
      Sid: 'ParticipantKeys',
      Effect: 'Allow',
      Action: 'secretsmanager:GetSecretValue',
      Resource: participants.map((p) => p.key.ref),
    };

    // --- coordinator: REST API (IAM-authorized), owns the transactions table, invokes participants --
    // Its own key (functions/twopc/src/age.rs, issue 42): it signs the age tokens of its answers with
    // HMAC-SHA-256 under it and verifies them on the retry. Readable by the coordinator's role alone: not
    // the sweeper's, not any participant's (a participant can read its service's message key, so a token
    // under that key would be one its operator could mint). Generated and rotated as the message keys.
    const ageTokenKey = new secretsmanager.CfnSecret(this, 'CoordinatorAgeTokenKey', {
      description: AGE_TOKEN_KEY_DESCRIPTION,
      generateSecretString: {
        secretStringTemplate: '{"id":"k1"}',
        generateStringKey: 'secret',
        passwordLength: 64,
        excludePunctuation: true,
      },
    });
    skip(ageTokenKey, [
      [
        'CKV_AWS_149',
        'Under the AWS-managed key aws/secretsmanager by design: no key policy or grant to keep (infra/DEPLOY.md, Who may invoke a participant)',
      ],
    ]);
    // The outcome events' bus (its section below, "Outcome events"): the sweeper sends its "open too
    // long" alerts there too. No resource policy: only this account's principals whose own policies
    // allow it may put events on it or add rules to it (operators only: event details carry abort
    // reasons that may name other principals' transactions).
    const outcomesEventBus = new events.CfnEventBus(this, 'OutcomesEventBus', {
      name: `${Aws.STACK_NAME}-outcomes`,
      description:
        'Transaction outcomes of the two-phase commit (source twopc: Transaction Committed, Aborted, Held, ' +
        'Open Too Long; deduplicate on detail.outcomeId). Operators only: no resource policy.',
    });
    // PutEvents on the outcomes bus only (twopc_fanout::outcomes): the outcomes function and the sweeper.
    const putOutcomeEvents: Statement = {
      Sid: 'OutcomeEvents',
      Effect: 'Allow',
      Action: 'events:PutEvents',
      Resource: outcomesEventBus.attrArn,
    };

    // The operators' outcome history (GET /admin/outcomes, the operators' API): the stack's one rule on
    // the bus writes the terminal outcomes (committed, aborted) to a log group of their own, which the
    // coordinator reads back (OUTCOME_LOG_GROUP, FilterLogEvents); an operators' consumer like any rule
    // on the bus. Kept LogRetentionInDays, as the functions' logs.
    const outcomeHistoryLogGroup = logGroup('OutcomeHistoryLogGroup', `/aws/events/${Aws.STACK_NAME}/outcomes`);
    const outcomeHistoryRule = new events.CfnRule(this, 'OutcomeHistoryRule', {
      description:
        'The terminal outcomes (committed, aborted) into the outcome history log group, which GET /admin/outcomes reads',
      eventBusName: outcomesEventBus.ref,
      eventPattern: { source: ['twopc'], 'detail-type': ['Transaction Committed', 'Transaction Aborted'] },
      state: 'ENABLED',
      targets: [
        {
          id: 'outcome-history',
          arn: `arn:${Aws.PARTITION}:logs:${Aws.REGION}:${Aws.ACCOUNT_ID}:log-group:${outcomeHistoryLogGroup.logGroupName}`,
        },
      ],
    });
    // EventBridge writes to a log group under the log group's resource policy (it takes no role for
    // CloudWatch Logs): this one lets it write to the outcome history only, for this rule only. One of the
    // account's 10 CloudWatch Logs resource policies per region.
    new logs.CfnResourcePolicy(this, 'OutcomeHistoryLogPolicy', {
      policyName: `${Aws.STACK_NAME}-outcome-history`,
      policyDocument:
        '{"Version": "2012-10-17", "Statement": [{"Sid": "OutcomeHistory", "Effect": "Allow", "Principal": ' +
        '{"Service": ["events.amazonaws.com", "delivery.logs.amazonaws.com"]}, "Action": ["logs:CreateLogStream", ' +
        `"logs:PutLogEvents"], "Resource": "${outcomeHistoryLogGroup.logGroupArn}", "Condition": {"ArnEquals": ` +
        `{"aws:SourceArn": "${outcomeHistoryRule.attrArn}"}}}]}`,
    });

    const coordinatorLogGroup = functionLogGroup('CoordinatorLogGroup', 'coordinator');
    const coordinatorRole = lambdaRole('CoordinatorRole', 'coordinator', coordinatorLogGroup, [
      transactionRecords,
      invokeRegisteredParticipants,
      readParticipantKeys,
      // Its own key, which signs and verifies age tokens (twopc::age; AGE_TOKEN_KEY names it): no other
      // role may read it.
      { Sid: 'AgeTokenKey', Effect: 'Allow', Action: 'secretsmanager:GetSecretValue', Resource: ageTokenKey.ref },
      // The operators' views (/admin, twopc::coordinator admin): a page of open transactions from the
      // sparse open index and the locks indexes (never a scan), the page's records in a batch, and the
      // items a record's keys name (read only: every write to a data table goes through its participant).
      {
        Sid: 'OperatorViews',
        Effect: 'Allow',
        Action: 'dynamodb:Query',
        Resource: [
          indexArn(transactionsTable, 'open-transactions'),
          ...participants.map((p) => indexArn(p.table, 'locks-by-expiry')),
        ],
      },
      {
        Sid: 'OperatorReads',
        Effect: 'Allow',
        Action: 'dynamodb:BatchGetItem',
        Resource: [transactionsTable.attrArn, ...participants.map((p) => p.table.attrArn)],
      },
      // The operators' outcome history (GET /admin/outcomes): it reads back the log group the outcomes
      // bus's rule writes (OUTCOME_LOG_GROUP, FilterLogEvents), no other log group.
      {
        Sid: 'OutcomeHistory',
        Effect: 'Allow',
        Action: 'logs:FilterLogEvents',
        Resource: outcomeHistoryLogGroup.logGroupArn,
      },
    ]);
    const coordinator = rust('CoordinatorFunction', 'coordinator', coordinatorRole, coordinatorLogGroup, {
      skips: [synchronous('API Gateway (the REST API)')],
      description: "2PC coordinator (POST /transactions, GET /transactions/{id}, POST /transactions/{id}/commit and /abort, the operators' /admin)",
      // Longer than the largest transaction timeout the coordinator accepts (MAX_TIMEOUT_MS, 25 s)
      // plus the commit phase (checked by infra/tests against the code); it answers within 27 s.
      timeout: 45,
      memorySize: 512,
      environment: {
        TRANSACTIONS_TABLE_NAME: transactionsTable.ref,
        METRICS_NAMESPACE: metricsNamespace,
        // The origin its answers allow (Access-Control-Allow-Origin), as the preflight's.
        CORS_ALLOW_ORIGIN: corsAllowOrigin.valueAsString,
        PARTICIPANTS: registry,
        PARTICIPANT_KEYS: participantKeys,
        PARTICIPANT_SIGNATURE: participantSignature.valueAsString,
        // Its own key (the ARN of its secret), which signs and verifies age tokens.
        AGE_TOKEN_KEY: ageTokenKey.ref,
        // Each service's own operation schemas (infra/service-operations.json, compact): what the
        // coordinator validates of their operations. Every service it names must be in PARTICIPANTS
        // (the coordinator refuses to start otherwise).
        SERVICE_OPERATIONS: operations,
        // Held transactions: which services accept a hold and for how long (JSON, `{}`: every service
        // up to 15 minutes), and the longest hold of any transaction.
        HOLD_POLICY: holdPolicy.valueAsString,
        MAX_HOLD_MS: maxHoldMs.valueAsString,
        // Who may do what: the owners of the items, the admins, the operators (infra/DEPLOY.md,
        // "Authorization").
        ACCESS_POLICY: accessPolicy.valueAsString,
        // The participants' tables, which the operators' views read (locks, the items a record names).
        PARTICIPANT_TABLES: participantTables,
        // The operators' outcome history (GET /admin/outcomes): the log group the outcomes bus's rule
        // writes the terminal outcomes to (its name).
        OUTCOME_LOG_GROUP: outcomeHistoryLogGroup.logGroupName,
      },
      // Reserved so that a burst of transactions cannot take the concurrency the sweeper and the
      // stream processor need (it also caps the coordinator); 0 reserves nothing.
      reservedConcurrency: [reserveCoordinator, coordinatorReservedConcurrency],
    });

    // --- sweeper: every minute, finishes stuck transactions and resolves expired locks ---------------
    const sweeperLogGroup = functionLogGroup('SweeperLogGroup', 'sweeper');
    const sweeperRole = lambdaRole('SweeperRole', 'sweeper', sweeperLogGroup, [
      {
        Sid: 'SparseIndexes',
        Effect: 'Allow',
        Action: 'dynamodb:Query',
        Resource: [
          indexArn(transactionsTable, 'open-transactions'),
          ...participants.map((p) => indexArn(p.table, 'locks-by-expiry')),
        ],
      },
      { Sid: 'ReadTransactionRecords', Effect: 'Allow', Action: 'dynamodb:GetItem', Resource: transactionsTable.attrArn },
      // What recovery writes (twopc::coordinator recover and drive, twopc::recovery, the postponement):
      // status changes with the votes, reason, updatedAt, expireAt and the index fields, sweepAttempts
      // and sweepError; the ABORTED record of an owner that never wrote one. Never who created a
      // transaction (principal), its idempotency hash (requestHash), its execution (executionId) or its
      // hold (holdMs, holdUntil): written by the coordinator alone, IAM refuses a sweeper's write naming
      // any of them.
      {
        Sid: 'RecoverTransactionRecords',
        Effect: 'Allow',
        Action: ['dynamodb:PutItem', 'dynamodb:UpdateItem'],
        Resource: transactionsTable.attrArn,
        Condition: refusingAttributes(coordinatorOnly),
      },
      // The locks index is KEYS_ONLY: reading a locked item tells the sweeper its owner. Every write
      // to a data table goes through the participant that owns it.
      {
        Sid: 'ReadLockedItems',
        Effect: 'Allow',
        Action: 'dynamodb:GetItem',
        Resource: participants.map((p) => p.table.attrArn),
      },
      invokeRegisteredParticipants,
      readParticipantKeys,
      // Its "Transaction Open Too Long" alerts (twopc_fanout::outcomes, PutEvents), on the outcomes bus
      // only (infra/DEPLOY.md, "Outcome events").
      putOutcomeEvents,
    ]);
    const sweeper = rust('SweeperFunction', 'sweeper', sweeperRole, sweeperLogGroup, {
      skips: [
        [
          'CKV_AWS_116',
          "Invoked by its one-minute schedule: a failed run's work is redone by the next run (SweepErrorsAlarm, SweeperNotRunningAlarm); a schedule event holds nothing to replay",
        ],
      ],
      description: '2PC sweeper (stuck transactions, expired locks); emits EMF metrics in TwoPhaseCommit/<stack>',
      // Bounded work per run, well inside the one-minute schedule.
      timeout: 50,
      environment: {
        TRANSACTIONS_TABLE_NAME: transactionsTable.ref,
        METRICS_NAMESPACE: metricsNamespace,
        PARTICIPANTS: registry,
        PARTICIPANT_TABLES: participantTables,
        PARTICIPANT_KEYS: participantKeys,
        PARTICIPANT_SIGNATURE: participantSignature.valueAsString,
        // Where its "Transaction Open Too Long" alerts go (the bus's name), and after how long an open
        // transaction gets one (each run, deduplicated downstream by detail.outcomeId).
        EVENT_BUS_NAME: outcomesEventBus.ref,
        OPEN_ALERT_AFTER_MS: openAlertAfterMs.valueAsString,
      },
      // Recovery keeps running whatever the coordinator's load (0 reserves nothing).
      reservedConcurrency: [reserveSweeper, sweeperReservedConcurrency],
    });
    const everyMinute = new events.Rule(this, 'SweeperFunctionEveryMinute', {
      description: 'Finish or abort stuck transactions, resolve expired locks',
      schedule: events.Schedule.rate(Duration.minutes(1)),
      targets: [new targets.LambdaFunction(sweeper)],
    });
    (everyMinute.node.defaultChild as events.CfnRule).overrideLogicalId('SweeperFunctionEveryMinute');

    // Each participant's resource policy, a second layer behind the signatures: its `live` alias (what
    // the registries name and the coordinator and the sweeper invoke) names the coordinator's and the
    // sweeper's roles, and no other principal. Within one account a principal's own identity-based
    // grant still suffices to invoke it (the two are additive): infra/DEPLOY.md, "Who may invoke a
    // participant", says what stops those, and what a participant in another account needs.
    for (const p of participants) {
      for (const [caller, role] of [
        ['Coordinator', coordinatorRole],
        ['Sweeper', sweeperRole],
      ] as const) {
        new lambda.CfnPermission(this, `Participant${p.service.key}InvokeBy${caller}`, {
          action: 'lambda:InvokeFunction',
          functionName: p.alias.functionArn,
          principal: role.attrArn,
        });
      }
    }

    // ---------------------------------------------------------------------------------------------
    // Change fan-out: streams of every table -> stream processor -> Firehose (lake) and WebSocket.
    // ---------------------------------------------------------------------------------------------
    // Stream records the event sources gave up on land here (Lambda's on-failure records: shard and
    // sequence range, not the records). The mappings retry until a record is 22 h old, two hours
    // before the stream (24 h retention) may trim it, so only a record that failed that long ends
    // here; the stream processor's `replay-dead-letters` action reads these back
    // (DEAD_LETTER_QUEUE_URL). The stream processor also sends here, with their content, the records
    // it gives up on itself (one it cannot judge, a commit too large for Firehose:
    // UnprocessableRecordsAlarm), at most 256 KiB each (replay::MAX_DEAD_LETTER_BYTES):
    // maximumMessageSize stays SQS's default, never below that.
    const streamFailureQueue = new sqs.CfnQueue(this, 'StreamFailureQueue', {
      // Encrypted with the AWS-managed key aws/sqs (KMS): the event sources and the stream processor use
      // it through SQS, which its key policy allows to every principal of the account.
      kmsMasterKeyId: 'alias/aws/sqs',
      messageRetentionPeriod: 1209600,
      // A replay holds a message at most the stream processor's timeout.
      visibilityTimeout: 300,
    });
    streamFailureQueue.applyRemovalPolicy(RemovalPolicy.DESTROY);

    // --- the lake: Firehose (DirectPut) into an encrypted, private, TLS-only bucket ------------------
    // The lake's access logs (S3 server access logs, or CloudTrail's data events of the lake): private,
    // encrypted (SSE-S3, the only encryption server access logging delivers to), TLS-only, kept a year.
    const lakeAuditBucket = new s3.CfnBucket(this, 'LakeAuditBucket', {
      bucketEncryption: {
        serverSideEncryptionConfiguration: [{ serverSideEncryptionByDefault: { sseAlgorithm: 'AES256' } }],
      },
      publicAccessBlockConfiguration: {
        blockPublicAcls: true,
        blockPublicPolicy: true,
        ignorePublicAcls: true,
        restrictPublicBuckets: true,
      },
      ownershipControls: { rules: [{ objectOwnership: 'BucketOwnerEnforced' }] },
      versioningConfiguration: { status: 'Enabled' },
      lifecycleConfiguration: {
        rules: [
          {
            id: 'ExpireAuditLogs',
            status: 'Enabled',
            expirationInDays: 365,
            noncurrentVersionExpiration: { noncurrentDays: 30 },
          },
          { id: 'AbortIncompleteUploads', status: 'Enabled', abortIncompleteMultipartUpload: { daysAfterInitiation: 7 } },
        ],
      },
    });
    lakeAuditBucket.applyRemovalPolicy(RemovalPolicy.RETAIN);
    skip(lakeAuditBucket, [
      [
        'CKV_AWS_18',
        'It is the access log bucket: logging it into itself loops (AWS advises against it), into another bucket only moves the question',
      ],
    ]);
    const lakeBucket = new s3.CfnBucket(this, 'LakeBucket', {
      bucketEncryption: {
        serverSideEncryptionConfiguration: [{ serverSideEncryptionByDefault: { sseAlgorithm: 'AES256' } }],
      },
      publicAccessBlockConfiguration: {
        blockPublicAcls: true,
        blockPublicPolicy: true,
        ignorePublicAcls: true,
        restrictPublicBuckets: true,
      },
      ownershipControls: { rules: [{ objectOwnership: 'BucketOwnerEnforced' }] },
      // Versioned: an object overwritten or deleted (by mistake, or by whoever got the delivery role)
      // stays recoverable as a noncurrent version for 90 days.
      versioningConfiguration: { status: 'Enabled' },
      lifecycleConfiguration: {
        rules: [
          { id: 'AbortIncompleteUploads', status: 'Enabled', abortIncompleteMultipartUpload: { daysAfterInitiation: 7 } },
          {
            id: 'ExpireNoncurrentVersions',
            status: 'Enabled',
            noncurrentVersionExpiration: { noncurrentDays: 90 },
            expiredObjectDeleteMarker: true,
          },
        ],
      },
    });
    lakeBucket.applyRemovalPolicy(RemovalPolicy.RETAIN);
    // Who read or wrote its objects (LakeAccessLogging): S3 server access logs into the audit bucket, or
    // a trail of its data events (LakeDataEventsTrail).
    lakeBucket.addPropertyOverride(
      'LoggingConfiguration',
      ifElseNothing(lakeServerAccessLogs, { DestinationBucketName: lakeAuditBucket.ref, LogFilePrefix: 's3-access/' }),
    );
    const lakeTrailName = `${Aws.STACK_NAME}-lake-data-events`;
    const lakeTrailArn = `arn:${Aws.PARTITION}:cloudtrail:${Aws.REGION}:${Aws.ACCOUNT_ID}:trail/${lakeTrailName}`;
    const lakeAuditBucketPolicy = new s3.CfnBucketPolicy(this, 'LakeAuditBucketPolicy', {
      bucket: lakeAuditBucket.ref,
      policyDocument: {
        Version: '2012-10-17',
        Statement: [
          {
            Sid: 'TlsOnly',
            Effect: 'Deny',
            Principal: '*',
            Action: 's3:*',
            Resource: [lakeAuditBucket.attrArn, `${lakeAuditBucket.attrArn}/*`],
            Condition: { Bool: { 'aws:SecureTransport': 'false' } },
          },
          // S3 server access logging of the lake bucket, from this account, under s3-access/ only.
          ifElseNothing(lakeServerAccessLogs, {
            Sid: 'LakeServerAccessLogs',
            Effect: 'Allow',
            Principal: { Service: 'logging.s3.amazonaws.com' },
            Action: 's3:PutObject',
            Resource: `${lakeAuditBucket.attrArn}/s3-access/*`,
            Condition: {
              ArnEquals: { 'aws:SourceArn': lakeBucket.attrArn },
              StringEquals: { 'aws:SourceAccount': Aws.ACCOUNT_ID },
            },
          }),
          // The trail of the lake's data events, under cloudtrail/ only.
          ifElseNothing(lakeCloudTrail, {
            Sid: 'LakeTrailAclCheck',
            Effect: 'Allow',
            Principal: { Service: 'cloudtrail.amazonaws.com' },
            Action: 's3:GetBucketAcl',
            Resource: lakeAuditBucket.attrArn,
            Condition: { StringEquals: { 'aws:SourceArn': lakeTrailArn } },
          }),
          ifElseNothing(lakeCloudTrail, {
            Sid: 'LakeTrailWrite',
            Effect: 'Allow',
            Principal: { Service: 'cloudtrail.amazonaws.com' },
            Action: 's3:PutObject',
            Resource: `${lakeAuditBucket.attrArn}/cloudtrail/AWSLogs/${Aws.ACCOUNT_ID}/*`,
            Condition: {
              StringEquals: { 'aws:SourceArn': lakeTrailArn, 's3:x-amz-acl': 'bucket-owner-full-control' },
            },
          }),
        ],
      },
    });
    // LakeAccessLogging=CloudTrailDataEvents: every object-level call on the lake (GetObject, PutObject,
    // DeleteObject, ...), with its caller, into the audit bucket; no management events.
    const lakeTrail = new cloudtrail.CfnTrail(this, 'LakeDataEventsTrail', {
      trailName: lakeTrailName,
      s3BucketName: lakeAuditBucket.ref,
      s3KeyPrefix: 'cloudtrail',
      isLogging: true,
      enableLogFileValidation: true,
      isMultiRegionTrail: false,
      includeGlobalServiceEvents: false,
      advancedEventSelectors: [
        {
          name: 'Object-level calls on the lake bucket',
          fieldSelectors: [
            { field: 'eventCategory', equalTo: ['Data'] },
            { field: 'resources.type', equalTo: ['AWS::S3::Object'] },
            { field: 'resources.ARN', startsWith: [`${lakeBucket.attrArn}/`] },
          ],
        },
      ],
    });
    lakeTrail.cfnOptions.condition = lakeCloudTrail;
    skip(lakeTrail, [
      ['CKV_AWS_67', "A trail of one bucket's data events, and the bucket is in this region: other regions hold nothing for it to log"],
      [
        'CKV_AWS_35',
        "Encrypted at rest by the audit bucket with SSE-S3 (S3's AWS-managed key), as the server access logs beside it must be: no customer key to manage or grant",
      ],
    ]);
    lakeTrail.addResourceDependency(lakeAuditBucketPolicy);
    const lakeObjects = `${lakeBucket.attrArn}/*`;
    new s3.CfnBucketPolicy(this, 'LakeBucketPolicy', {
      bucket: lakeBucket.ref,
      policyDocument: {
        Version: '2012-10-17',
        Statement: [
          {
            Sid: 'TlsOnly',
            Effect: 'Deny',
            Principal: '*',
            Action: 's3:*',
            Resource: [lakeBucket.attrArn, lakeObjects],
            Condition: { Bool: { 'aws:SecureTransport': 'false' } },
          },
        ],
      },
    });

    const lakeDeliveryLogGroup = logGroup('LakeDeliveryLogGroup', `/aws/kinesisfirehose/${Aws.STACK_NAME}-lake`);
    const lakeDeliveryLogStream = new logs.CfnLogStream(this, 'LakeDeliveryLogStream', {
      logGroupName: lakeDeliveryLogGroup.logGroupName,
      logStreamName: 'S3Delivery',
    });
    lakeDeliveryLogStream.applyRemovalPolicy(RemovalPolicy.DESTROY);
    const lakeDeliveryRole = new iam.CfnRole(this, 'LakeDeliveryRole', {
      assumeRolePolicyDocument: {
        Version: '2012-10-17',
        Statement: [
          {
            Effect: 'Allow',
            Principal: { Service: 'firehose.amazonaws.com' },
            Action: 'sts:AssumeRole',
            Condition: { StringEquals: { 'sts:ExternalId': Aws.ACCOUNT_ID } },
          },
        ],
      },
      policies: [
        {
          policyName: 'lake-delivery',
          policyDocument: {
            Version: '2012-10-17',
            Statement: [
              {
                Sid: 'LakeBucket',
                Effect: 'Allow',
                Action: ['s3:GetBucketLocation', 's3:ListBucket', 's3:ListBucketMultipartUploads'],
                Resource: lakeBucket.attrArn,
              },
              {
                Sid: 'LakeObjects',
                Effect: 'Allow',
                Action: ['s3:AbortMultipartUpload', 's3:GetObject', 's3:PutObject'],
                Resource: lakeObjects,
              },
              {
                Sid: 'DeliveryErrors',
                Effect: 'Allow',
                Action: 'logs:PutLogEvents',
                Resource: `arn:${Aws.PARTITION}:logs:${Aws.REGION}:${Aws.ACCOUNT_ID}:log-group:${lakeDeliveryLogGroup.logGroupName}:log-stream:${lakeDeliveryLogStream.ref}`,
              },
            ],
          },
        },
      ],
    });

    // Newline-delimited JSON objects (the stream processor writes one per line), GZIP-compressed,
    // partitioned by the hour they arrived: data/YYYY/MM/DD/HH/ (LakeTable projects these four).
    const lakeDeliveryStream = new firehose.CfnDeliveryStream(this, 'LakeDeliveryStream', {
      deliveryStreamType: 'DirectPut',
      deliveryStreamEncryptionConfigurationInput: { keyType: 'AWS_OWNED_CMK' },
      extendedS3DestinationConfiguration: {
        bucketArn: lakeBucket.attrArn,
        roleArn: lakeDeliveryRole.attrArn,
        prefix: 'data/!{timestamp:yyyy}/!{timestamp:MM}/!{timestamp:dd}/!{timestamp:HH}/',
        errorOutputPrefix:
          'errors/!{firehose:error-output-type}/!{timestamp:yyyy}/!{timestamp:MM}/!{timestamp:dd}/!{timestamp:HH}/',
        bufferingHints: { intervalInSeconds: 60, sizeInMBs: 5 },
        // GZIP objects (`.gz`): Athena reads them as they are (see LakeTable).
        compressionFormat: 'GZIP',
        cloudWatchLoggingOptions: {
          enabled: true,
          logGroupName: lakeDeliveryLogGroup.logGroupName,
          logStreamName: lakeDeliveryLogStream.ref,
        },
      },
    });

    // The lake as an Athena table: Glue database + table over data/, one projected partition key per
    // partition of the Firehose prefix (data/YYYY/MM/DD/HH/), so Athena needs no crawler and no MSCK
    // REPAIR. Columns: the lake record (functions/fanout/src/decide.rs, ChangeRecord).
    const lakeDatabase = new glue.CfnDatabase(this, 'LakeDatabase', {
      catalogId: Aws.ACCOUNT_ID,
      databaseInput: {
        name: lakeDatabaseName.valueAsString,
        description: 'Committed changes of the two-phase-commit system (the data lake)',
      },
    });
    new glue.CfnTable(this, 'LakeTable', {
      catalogId: Aws.ACCOUNT_ID,
      databaseName: lakeDatabase.ref,
      tableInput: {
        name: 'changes',
        description:
          'One row per committed change (kind null) and one per committed transaction (kind transaction), NDJSON, GZIP, partitioned by the hour Firehose received it',
        tableType: 'EXTERNAL_TABLE',
        parameters: {
          classification: 'json',
          compressionType: 'gzip',
          'projection.enabled': 'true',
          'projection.year.type': 'integer',
          'projection.year.range': '2024,2040',
          'projection.month.type': 'integer',
          'projection.month.range': '1,12',
          'projection.month.digits': '2',
          'projection.day.type': 'integer',
          'projection.day.range': '1,31',
          'projection.day.digits': '2',
          'projection.hour.type': 'integer',
          'projection.hour.range': '0,23',
          'projection.hour.digits': '2',
          // The Firehose prefix with the projected keys in place of its timestamp fields.
          'storage.location.template': `s3://${lakeBucket.ref}/data/\${year}/\${month}/\${day}/\${hour}/`,
        },
        partitionKeys: [
          { name: 'year', type: 'int' },
          { name: 'month', type: 'int' },
          { name: 'day', type: 'int' },
          { name: 'hour', type: 'int' },
        ],
        storageDescriptor: {
          location: `s3://${lakeBucket.ref}/data/`,
          inputFormat: 'org.apache.hadoop.mapred.TextInputFormat',
          outputFormat: 'org.apache.hadoop.hive.ql.io.HiveIgnoreKeyTextOutputFormat',
          // Field names are matched case-insensitively: transactionId is column transactionid.
          serdeInfo: { serializationLibrary: 'org.openx.data.jsonserde.JsonSerDe' },
          // key, data and previous are JSON objects: read them with json_extract_scalar.
          columns: [
            { name: 'eventid', type: 'string', comment: 'stream record id: dedupes at-least-once deliveries' },
            { name: 'transactionid', type: 'string' },
            { name: 'service', type: 'string' },
            { name: 'table', type: 'string' },
            { name: 'key', type: 'string', comment: 'the item key (JSON)' },
            { name: 'change', type: 'string', comment: 'INSERT, MODIFY or REMOVE' },
            { name: 'version', type: 'bigint' },
            { name: 'committedat', type: 'string', comment: 'RFC 3339' },
            { name: 'data', type: 'string', comment: "the item's data after the commit (JSON)" },
            { name: 'previous', type: 'string', comment: "the item's data before the commit (JSON)" },
            // A transaction line's own columns (null on a per-item line); it has eventid, transactionid and
            // committedat too (functions/fanout/src/decide.rs, TransactionLine; queries: docs/lake.md).
            { name: 'kind', type: 'string', comment: 'transaction on a transaction line, null on a per-item line' },
            { name: 'firsttransactionid', type: 'string', comment: "an attempt after the first: its request's first attempt" },
            {
              name: 'participants',
              type: 'array<struct<service:string,table:string,changes:bigint>>',
              comment: 'each participant and its number of per-item lines',
            },
            { name: 'changes', type: 'bigint', comment: "the transaction's number of per-item lines" },
          ],
        },
      },
    });

    // --- WebSocket API: $connect is IAM-authorized (SigV4-signed upgrade request) -------------------
    const webSocketApi = new apigatewayv2.CfnApi(this, 'WebSocketApi', {
      name: `${Aws.STACK_NAME}-changes`,
      protocolType: 'WEBSOCKET',
      routeSelectionExpression: '$request.body.action',
    });
    const webSocketHost = `${webSocketApi.ref}.execute-api.${Aws.REGION}.${Aws.URL_SUFFIX}/${webSocketStageName.valueAsString}`;

    // --- stream processor -----------------------------------------------------------------------------
    const streamedTables: Array<[string, dynamodb.CfnTable]> = [
      ['Transactions', transactionsTable],
      ...participants.map((p): [string, dynamodb.CfnTable] => [`Service${p.service.key}`, p.table]),
    ];
    const streamProcessorLogGroup = functionLogGroup('StreamProcessorLogGroup', 'stream-processor');
    const streamProcessorRole = lambdaRole('StreamProcessorRole', 'stream-processor', streamProcessorLogGroup, [
      {
        Sid: 'ReadStreams',
        Effect: 'Allow',
        Action: ['dynamodb:DescribeStream', 'dynamodb:GetRecords', 'dynamodb:GetShardIterator'],
        Resource: streamedTables.map(([, t]) => t.attrStreamArn),
      },
      // dynamodb:ListStreams has no resource type in IAM: it can only be granted on "*". It lists
      // stream ARNs, nothing else.
      { Sid: 'ListStreams', Effect: 'Allow', Action: 'dynamodb:ListStreams', Resource: '*' },
      // Lambda's on-failure records of the event sources (sent with this role), and the records the
      // stream processor dead-letters itself, with their content.
      { Sid: 'FailedBatches', Effect: 'Allow', Action: 'sqs:SendMessage', Resource: streamFailureQueue.attrArn },
      // The `replay-dead-letters` action: reads the dead letters back (Lambda's and its own), deletes
      // each one replayed, counts what remains.
      {
        Sid: 'ReplayFailedBatches',
        Effect: 'Allow',
        Action: ['sqs:ReceiveMessage', 'sqs:DeleteMessage', 'sqs:GetQueueAttributes'],
        Resource: streamFailureQueue.attrArn,
      },
      { Sid: 'Lake', Effect: 'Allow', Action: 'firehose:PutRecordBatch', Resource: lakeDeliveryStream.attrArn },
      { Sid: 'Subscribers', Effect: 'Allow', Action: 'dynamodb:Query', Resource: indexArn(connectionsTable, 'by-topic') },
      // A post that answers Gone removes the connection as its $disconnect would: its caller's place
      // under MAX_CONNECTIONS_PER_PRINCIPAL given back (GetItem the connection's item, UpdateItem its
      // caller's), its items (Query by connectionId) deleted with BatchWriteItem.
      {
        Sid: 'ForgetGoneConnections',
        Effect: 'Allow',
        Action: ['dynamodb:GetItem', 'dynamodb:UpdateItem', 'dynamodb:Query', 'dynamodb:BatchWriteItem'],
        Resource: connectionsTable.attrArn,
      },
      // Push-time authorization: before a change goes to its subscribers, the connection items of those
      // subscribers (who each one is: its principal, whether an admin) are read with BatchGetItem, so
      // that a change reaches only the connections that may read it.
      {
        Sid: 'SubscriberPrincipals',
        Effect: 'Allow',
        Action: 'dynamodb:BatchGetItem',
        Resource: connectionsTable.attrArn,
      },
      {
        Sid: 'PushToConnections',
        Effect: 'Allow',
        Action: 'execute-api:ManageConnections',
        Resource: `arn:${Aws.PARTITION}:execute-api:${Aws.REGION}:${Aws.ACCOUNT_ID}:${webSocketApi.ref}/${webSocketStageName.valueAsString}/POST/@connections/*`,
      },
    ]);
    const streamProcessor = rust('StreamProcessorFunction', 'stream-processor', streamProcessorRole, streamProcessorLogGroup, {
      skips: [
        [
          'CKV_AWS_116',
          'Invoked by stream event source mappings whose on-failure destination is StreamFailureQueue (a function DLQ serves asynchronous invocations only)',
        ],
      ],
      description: 'Fans committed changes out to the lake (Firehose) and to WebSocket subscribers',
      timeout: 60,
      environment: {
        TRANSACTIONS_TABLE_NAME: transactionsTable.ref,
        PARTICIPANT_TABLES: participantTables,
        CONNECTIONS_TABLE_NAME: connectionsTable.ref,
        FIREHOSE_STREAM_NAME: lakeDeliveryStream.ref,
        WEBSOCKET_ENDPOINT: `https://${webSocketHost}`,
        // What the event sources gave up on, and what it gives up on itself (with the record); its
        // `replay-dead-letters` action reads both back.
        DEAD_LETTER_QUEUE_URL: streamFailureQueue.ref,
        // Its UnprocessableRecords count, in the namespace of the coordinator's and sweeper's.
        METRICS_NAMESPACE: metricsNamespace,
        // Which subscribers may see a change (read access of each connection's principal).
        ACCESS_POLICY: accessPolicy.valueAsString,
        // The coordinator's SERVICE_OPERATIONS: a resource's operations (`"resource": true`) write no
        // item, so a transaction's lake line counts them as no change.
        SERVICE_OPERATIONS: operations,
      },
      // The fan-out keeps up whatever the coordinator's load (0 reserves nothing).
      reservedConcurrency: [reserveStreamProcessor, streamProcessorReservedConcurrency],
    });
    // Each table's stream: partial batch failures and bisection on error; retried without a count
    // limit (-1) until a record is 24 h old, the stream's retention, so that an outage of the lake or
    // the WebSocket API of hours loses nothing; only then is it described in the on-failure queue
    // (StreamFailuresAlarm). StreamProcessorIteratorAgeAlarm fires within minutes of falling behind.
    for (const [name, source] of streamedTables) {
      new lambda.CfnEventSourceMapping(this, `StreamProcessorFunction${name}Stream`, {
        functionName: streamProcessor.functionName,
        eventSourceArn: source.attrStreamArn,
        startingPosition: 'TRIM_HORIZON',
        batchSize: 100,
        functionResponseTypes: ['ReportBatchItemFailures'],
        bisectBatchOnFunctionError: true,
        maximumRetryAttempts: -1,
        maximumRecordAgeInSeconds: 79200,
        destinationConfig: { onFailure: { destination: streamFailureQueue.attrArn } },
      });
    }

    // ---------------------------------------------------------------------------------------------
    // Outcome events: the transactions table's stream -> outcomes -> the outcomes bus (above), one
    // event per outcome (committed, aborted, held) (infra/DEPLOY.md, "Outcome events").
    // ---------------------------------------------------------------------------------------------
    // The outcomes mapping's on-failure destination: Lambda's on-failure records (shard and sequence
    // range, not the records) of the batches it gave up on, whose outcome events were not all sent
    // (OutcomesFailuresAlarm). Encrypted with the AWS-managed key aws/sqs, as StreamFailureQueue.
    const outcomesFailureQueue = new sqs.CfnQueue(this, 'OutcomesFailureQueue', {
      kmsMasterKeyId: 'alias/aws/sqs',
      messageRetentionPeriod: 1209600,
    });
    outcomesFailureQueue.applyRemovalPolicy(RemovalPolicy.DESTROY);
    const outcomesLogGroup = functionLogGroup('OutcomesLogGroup', 'outcomes');
    const outcomesRole = lambdaRole('OutcomesRole', 'outcomes', outcomesLogGroup, [
      // Its event source mapping reads the transactions table's stream, and no other.
      {
        Sid: 'ReadStreams',
        Effect: 'Allow',
        Action: ['dynamodb:DescribeStream', 'dynamodb:GetRecords', 'dynamodb:GetShardIterator'],
        Resource: transactionsTable.attrStreamArn,
      },
      // dynamodb:ListStreams has no resource type in IAM: it can only be granted on "*". It lists stream
      // ARNs, nothing else; Lambda's DynamoDB event source mapping needs it in the function's role, as the
      // stream processor's.
      { Sid: 'ListStreams', Effect: 'Allow', Action: 'dynamodb:ListStreams', Resource: '*' },
      // Lambda's on-failure records of its event source mapping (sent with this role).
      { Sid: 'FailedBatches', Effect: 'Allow', Action: 'sqs:SendMessage', Resource: outcomesFailureQueue.attrArn },
      // One event per outcome (twopc_fanout::outcomes, PutEvents), on the outcomes bus only.
      putOutcomeEvents,
    ]);
    const outcomes = rust('OutcomesFunction', 'outcomes', outcomesRole, outcomesLogGroup, {
      skips: [
        uncapped(
          'its one event source runs at most one batch per shard of the transactions stream at a time; a reservation would only take concurrency from the others',
        ),
        [
          'CKV_AWS_116',
          'Invoked by a stream event source mapping whose on-failure destination is OutcomesFailureQueue (a function DLQ serves asynchronous invocations only)',
        ],
      ],
      description: 'Sends one EventBridge event per transaction outcome (committed, aborted, held) to the outcomes bus',
      // As the stream processor's: a batch of 100 records is at most 10 PutEvents calls.
      timeout: 60,
      environment: {
        TRANSACTIONS_TABLE_NAME: transactionsTable.ref,
        // The bus's name (PutEvents' EventBusName).
        EVENT_BUS_NAME: outcomesEventBus.ref,
      },
    });
    // The transactions table's second reader (the stream processor is the first; DynamoDB Streams
    // recommends at most two per shard: infra/DEPLOY.md, "Outcome events"). LATEST: a new stack, or an
    // upgrade, sends the outcomes decided from then on, not the stream's last 24 h. Partial batch
    // failures and bisection on error; a failing record is retried at most 10000 times and until it is
    // 22 h old (two hours inside the stream's retention), then described in its own on-failure queue
    // (OutcomesFailuresAlarm); OutcomesIteratorAgeAlarm fires within minutes of falling behind.
    new lambda.CfnEventSourceMapping(this, 'OutcomesFunctionTransactionsStream', {
      functionName: outcomes.functionName,
      eventSourceArn: transactionsTable.attrStreamArn,
      startingPosition: 'LATEST',
      batchSize: 100,
      functionResponseTypes: ['ReportBatchItemFailures'],
      bisectBatchOnFunctionError: true,
      maximumRetryAttempts: 10000,
      maximumRecordAgeInSeconds: 79200,
      destinationConfig: { onFailure: { destination: outcomesFailureQueue.attrArn } },
    });

    // --- connections: the WebSocket routes and the subscription table ---------------------------------
    const connectionsLogGroup = functionLogGroup('ConnectionsLogGroup', 'connections');
    const connectionsRole = lambdaRole('ConnectionsRole', 'connections', connectionsLogGroup, [
      // What functions/fanout/src/connections.rs calls: $connect: GetItem and PutItem (the
      // caller's item: its open connections, under MAX_CONNECTIONS_PER_PRINCIPAL), UpdateItem (the
      // connection's item with its caller, its topic counter kept); subscribe and unsubscribe: GetItem
      // (the connection's caller), Query (the connection's topics), then TransactWriteItems of PutItem
      // or DeleteItem (each topic) with UpdateItem (the counter, under MAX_TOPICS_PER_CONNECTION);
      // $disconnect: GetItem and UpdateItem (the caller's place given back), Query the connection's
      // items, BatchWriteItem to delete them.
      {
        Sid: 'Subscriptions',
        Effect: 'Allow',
        Action: [
          'dynamodb:GetItem',
          'dynamodb:PutItem',
          'dynamodb:UpdateItem',
          'dynamodb:DeleteItem',
          'dynamodb:Query',
          'dynamodb:BatchWriteItem',
        ],
        Resource: connectionsTable.attrArn,
      },
      // A `tx:<id>` topic: the transaction's record tells who created it (only its creator, or an
      // admin, may follow it); read with GetItem, nothing else of the transactions table.
      { Sid: 'TransactionOwners', Effect: 'Allow', Action: 'dynamodb:GetItem', Resource: transactionsTable.attrArn },
    ]);
    const connections = rust('ConnectionsFunction', 'connections', connectionsRole, connectionsLogGroup, {
      skips: [
        synchronous('the WebSocket API'),
        uncapped(
          'WebSocket clients are bounded per caller (MaxConnectionsPerPrincipal) and by stage throttling; a cap would refuse connections',
        ),
      ],
      description: 'WebSocket $connect/$disconnect/subscribe/unsubscribe',
      environment: {
        CONNECTIONS_TABLE_NAME: connectionsTable.ref,
        MAX_TOPICS_PER_CONNECTION: maxTopicsPerConnection.valueAsString,
        // Where a `tx:` topic's creator is read.
        TRANSACTIONS_TABLE_NAME: transactionsTable.ref,
        // How many connections one caller may hold open at once (counted in the connections table).
        MAX_CONNECTIONS_PER_PRINCIPAL: maxConnectionsPerPrincipal.valueAsString,
        // Who may follow what (the owners of the items, the admins).
        ACCESS_POLICY: accessPolicy.valueAsString,
        // The WebSocket API it serves: an event of another API is refused.
        WEBSOCKET_API_ID: webSocketApi.ref,
      },
    });

    // --- authorizer (only when JwtIssuer is set): one Lambda REQUEST authorizer for both APIs, which
    // checks a JSON Web Token of JwtIssuer for JwtAudience against the issuer's keys (JWKS, fetched over
    // HTTPS) and answers an IAM policy with the caller's principal (`jwt:<iss>#<sub>`). It needs no
    // AWS permission beyond its log group. ---------------------------------------------------------------
    const authorizerLogGroup = functionLogGroup('AuthorizerLogGroup', 'authorizer');
    const authorizerRole = lambdaRole('AuthorizerRole', 'authorizer', authorizerLogGroup, []);
    const authorizer = rust('AuthorizerFunction', 'authorizer', authorizerRole, authorizerLogGroup, {
      skips: [
        synchronous('API Gateway (an authorizer)'),
        uncapped('it serves every request of both APIs, bounded by their stage throttling; a cap would refuse callers'),
      ],
      description: 'JWT authorizer of the REST API\'s methods and the WebSocket API\'s $connect',
      environment: {
        // The tokens' iss and aud, exactly; the keys from the issuer's JWKS.
        JWT_ISSUER: jwtIssuer.valueAsString,
        JWT_AUDIENCE: jwtAudience.valueAsString,
        // Empty: <JWT_ISSUER>/.well-known/jwks.json.
        JWKS_URL: jwksUrl.valueAsString,
        // Who is an admin (groups, claim): in the context it passes on.
        ACCESS_POLICY: accessPolicy.valueAsString,
      },
    });
    for (const resource of [
      authorizerLogGroup.node.defaultChild as logs.CfnLogGroup,
      authorizerRole,
      authorizer.node.defaultChild as lambda.CfnFunction,
    ]) {
      resource.cfnOptions.condition = useJwt;
    }
    const authorizerUri = `arn:${Aws.PARTITION}:apigateway:${Aws.REGION}:lambda:path/2015-03-31/functions/${authorizer.functionArn}/invocations`;

    const webSocketIntegration = new apigatewayv2.CfnIntegration(this, 'WebSocketIntegration', {
      apiId: webSocketApi.ref,
      integrationType: 'AWS_PROXY',
      integrationUri: `arn:${Aws.PARTITION}:apigateway:${Aws.REGION}:lambda:path/2015-03-31/functions/${connections.functionArn}/invocations`,
    });
    // The WebSocket API's authorizer: REQUEST, without an identity source, since the token may come as
    // the `token` query parameter or as the Authorization header (an identity source would make API
    // Gateway refuse a request that lacks it before asking the authorizer; without one, nothing is
    // cached either).
    const webSocketAuthorizer = new apigatewayv2.CfnAuthorizer(this, 'WebSocketAuthorizer', {
      apiId: webSocketApi.ref,
      name: 'jwt',
      authorizerType: 'REQUEST',
      authorizerUri,
    });
    webSocketAuthorizer.cfnOptions.condition = useJwt;
    // `twoWay`: the connections function's answer ({"subscribed": [...], "refused": [...]}) is sent
    // back to the client, through a $default route response that passes the proxy body on.
    const route = (
      logicalId: string,
      routeKey: string,
      operationName: string,
      authorizationType: string,
      twoWay = false,
      authorizerId?: string,
    ) => {
      const r = new apigatewayv2.CfnRoute(this, logicalId, {
        apiId: webSocketApi.ref,
        routeKey,
        authorizationType,
        authorizerId,
        operationName,
        target: `integrations/${webSocketIntegration.ref}`,
        routeResponseSelectionExpression: twoWay ? '$default' : undefined,
      });
      if (!twoWay) return [r];
      const response = new apigatewayv2.CfnRouteResponse(this, `${logicalId}Response`, {
        apiId: webSocketApi.ref,
        routeId: r.ref,
        routeResponseKey: '$default',
      });
      return [r, response];
    };
    const routes = [
      // SigV4-signed upgrade request, or, when JwtIssuer is set, the authorizer function (the token as
      // the `token` query parameter or the Authorization header). The other routes run on a
      // connection $connect admitted.
      ...route(
        'ConnectRoute',
        '$connect',
        'Connect',
        ifJwt('CUSTOM', 'AWS_IAM').toString(),
        false,
        ifJwt(webSocketAuthorizer.ref, Aws.NO_VALUE).toString(),
      ),
      ...route('DisconnectRoute', '$disconnect', 'Disconnect', 'NONE'),
      ...route('SubscribeRoute', 'subscribe', 'Subscribe', 'NONE', true),
      ...route('UnsubscribeRoute', 'unsubscribe', 'Unsubscribe', 'NONE', true),
    ];
    const webSocketStage = new apigatewayv2.CfnStage(this, 'WebSocketStage', {
      apiId: webSocketApi.ref,
      stageName: webSocketStageName.valueAsString,
      autoDeploy: true,
      defaultRouteSettings: {
        throttlingRateLimit: apiThrottlingRateLimit.valueAsNumber,
        throttlingBurstLimit: apiThrottlingBurstLimit.valueAsNumber,
      },
      // One JSON line per message: who, the route, the status and the latency (infra/DEPLOY.md,
      // "Access logs").
      accessLogSettings: {
        destinationArn: webSocketAccessLogGroup.logGroupArn,
        format: WEBSOCKET_ACCESS_LOG_FORMAT,
      },
    });
    // Created after the routes and route responses so that the stage's first automatic deployment
    // contains them; later route changes are deployed automatically too.
    for (const r of routes) webSocketStage.node.addDependency(r);
    new lambda.CfnPermission(this, 'WebSocketInvokePermission', {
      action: 'lambda:InvokeFunction',
      functionName: connections.functionName,
      principal: 'apigateway.amazonaws.com',
      sourceArn: `arn:${Aws.PARTITION}:execute-api:${Aws.REGION}:${Aws.ACCOUNT_ID}:${webSocketApi.ref}/${webSocketStageName.valueAsString}/*`,
    });

    // ---------------------------------------------------------------------------------------------
    // REST API (IAM-authorized, or JWT-authorized when JwtIssuer is set) in front of the coordinator.
    // ---------------------------------------------------------------------------------------------
    const restApiName = `${Aws.STACK_NAME}-transactions`;
    const restApi = new apigateway.RestApi(this, 'RestApi', {
      restApiName,
      endpointTypes: [apigateway.EndpointType.REGIONAL],
      // No account-wide CloudWatch role for API Gateway (it carries a managed policy).
      cloudWatchRole: false,
      deployOptions: {
        stageName: apiStageName.valueAsString,
        methodOptions: {
          '/*/*': {
            throttlingRateLimit: apiThrottlingRateLimit.valueAsNumber,
            throttlingBurstLimit: apiThrottlingBurstLimit.valueAsNumber,
          },
        },
      },
      // Callers sign with SigV4 and need execute-api:Invoke only: API Gateway invokes the coordinator
      // through the function's resource policy (the permissions below), never with their credentials.
      // (With JwtIssuer set, the coordinator's methods take the JWT authorizer instead: see below.)
      defaultMethodOptions: { authorizationType: apigateway.AuthorizationType.IAM },
    });
    (restApi.node.defaultChild as apigateway.CfnRestApi).overrideLogicalId('RestApi');
    const restStage = restApi.deploymentStage.node.defaultChild as apigateway.CfnStage;
    restStage.overrideLogicalId('RestApiStage');
    restStage.addPropertyOverride('TracingEnabled', Fn.conditionIf(tracingActive.logicalId, true, false));
    skip(restStage, [
      ['CKV_AWS_73', 'X-Ray tracing is a parameter: TracingMode=Active turns it on (infra/DEPLOY.md, Tracing)'],
      ['CKV_AWS_120', 'No caching: a cached GET /transactions/{id} would answer stale statuses'],
    ]);
    // One JSON line per request: who (the IAM caller, or the JWT principal the authorizer passed on), the
    // route, the status and the latency (infra/DEPLOY.md, "Access logs").
    restStage.addPropertyOverride('AccessLogSetting', {
      DestinationArn: restApiAccessLogGroup.logGroupArn,
      Format: REST_ACCESS_LOG_FORMAT,
    });
    // The construct's own output (the URL under a generated name): RestApiUrl below is the one.
    restApi.node.tryRemoveChild('Endpoint');
    // Permissions scoped to each method of the stage; none for the console's test invocations.
    const coordinatorIntegration = new apigateway.LambdaIntegration(coordinator, { proxy: true, allowTestInvoke: false });
    // The preflight: an OPTIONS mock on /transactions and on each path below it (the options are
    // inherited), answered by API Gateway with the values of functions/twopc/src/cors.rs (SAM: the
    // Api's Cors, on the paths it serves). CDK gives these methods no authorization whatever the
    // default above (browsers never sign a preflight). One origin, the parameter: a plain header (CDK
    // writes a VTL template only for several origins).
    const transactions = restApi.root.addResource('transactions', {
      defaultCorsPreflightOptions: {
        allowOrigins: [corsAllowOrigin.valueAsString],
        allowMethods: CORS_ALLOW_METHODS,
        allowHeaders: CORS_ALLOW_HEADERS,
        maxAge: Duration.seconds(CORS_MAX_AGE_SECONDS),
        // As SAM's preflight answers.
        statusCode: 200,
      },
    });
    const transaction = transactions.addResource('{id}');
    const coordinatorMethods = [
      transactions.addMethod('POST', coordinatorIntegration),
      transaction.addMethod('GET', coordinatorIntegration),
      // A held transaction's decision (holdMs): authorized as POST /transactions; only the principal
      // that created it may commit or abort it. Their preflight is inherited.
      transaction.addResource('commit').addMethod('POST', coordinatorIntegration),
      transaction.addResource('abort').addMethod('POST', coordinatorIntegration),
    ];
    // The operators' routes: authorized as the others; the coordinator answers 403 to any caller the
    // access policy does not name as an operator. A preflight on each path they serve, as SAM's Cors
    // (not on /admin itself, which serves nothing).
    const preflight = {
      defaultCorsPreflightOptions: {
        allowOrigins: [corsAllowOrigin.valueAsString],
        allowMethods: CORS_ALLOW_METHODS,
        allowHeaders: CORS_ALLOW_HEADERS,
        maxAge: Duration.seconds(CORS_MAX_AGE_SECONDS),
        statusCode: 200,
      },
    };
    const admin = restApi.root.addResource('admin');
    const adminTransactions = admin.addResource('transactions', preflight);
    const adminTransaction = adminTransactions.addResource('{id}');
    coordinatorMethods.push(
      adminTransactions.addMethod('GET', coordinatorIntegration),
      adminTransaction.addMethod('GET', coordinatorIntegration),
      admin.addResource('stuck', preflight).addMethod('GET', coordinatorIntegration),
      // The recent outcomes, read back from the outcome history (OUTCOME_LOG_GROUP).
      admin.addResource('outcomes', preflight).addMethod('GET', coordinatorIntegration),
      adminTransaction.addResource('retry').addMethod('POST', coordinatorIntegration),
      adminTransaction.addResource('abort').addMethod('POST', coordinatorIntegration),
    );
    // When JwtIssuer is set, every method (not the preflight) takes the authorizer function as a
    // Lambda REQUEST authorizer on the Authorization header instead of IAM, its answers never cached
    // (TTL 0: an expired token is refused at once).
    const restAuthorizer = new apigateway.CfnAuthorizer(this, 'RestApiAuthorizer', {
      restApiId: restApi.restApiId,
      name: 'jwt',
      type: 'REQUEST',
      identitySource: 'method.request.header.Authorization',
      authorizerUri,
      authorizerResultTtlInSeconds: 0,
    });
    restAuthorizer.cfnOptions.condition = useJwt;
    for (const method of coordinatorMethods) {
      const resource = method.node.defaultChild as apigateway.CfnMethod;
      resource.addPropertyOverride('AuthorizationType', ifJwt('CUSTOM', 'AWS_IAM'));
      resource.addPropertyOverride('AuthorizerId', ifJwt(restAuthorizer.ref, Aws.NO_VALUE));
    }
    // API Gateway may invoke the authorizer for the authorizers of these two APIs, nothing else.
    for (const [logicalId, source] of [
      ['AuthorizerInvokeByRestApi', `${restApi.restApiId}/authorizers/*`],
      ['AuthorizerInvokeByWebSocketApi', `${webSocketApi.ref}/authorizers/${webSocketAuthorizer.ref}`],
    ] as const) {
      const permission = new lambda.CfnPermission(this, logicalId, {
        action: 'lambda:InvokeFunction',
        functionName: authorizer.functionArn,
        principal: 'apigateway.amazonaws.com',
        sourceArn: `arn:${Aws.PARTITION}:execute-api:${Aws.REGION}:${Aws.ACCOUNT_ID}:${source}`,
      });
      permission.cfnOptions.condition = useJwt;
    }
    // WafEnabled: an AWS WAF web ACL on the REST stage. A client IP above WafRateLimit requests in any 5
    // minutes is blocked (403) until its rate falls below it; AWS's known bad inputs (Log4j, ...) too. Its
    // decisions are logged (aws-waf-logs-<stack>-rest-api), and show in the access logs (wafStatus).
    const visibility = (metricName: string) => ({
      sampledRequestsEnabled: true,
      cloudWatchMetricsEnabled: true,
      metricName,
    });
    const webAcl = new wafv2.CfnWebACL(this, 'RestApiWebAcl', {
      name: `${Aws.STACK_NAME}-rest-api`,
      description: 'Rate limit per client IP and known bad inputs, in front of the two-phase-commit REST API',
      scope: 'REGIONAL',
      defaultAction: { allow: {} },
      visibilityConfig: visibility(`${Aws.STACK_NAME}-rest-api`),
      rules: [
        {
          name: 'rate-limit-per-ip',
          priority: 0,
          action: { block: {} },
          statement: { rateBasedStatement: { limit: wafRateLimit.valueAsNumber, aggregateKeyType: 'IP' } },
          visibilityConfig: visibility('rate-limit-per-ip'),
        },
        {
          name: 'known-bad-inputs',
          priority: 1,
          overrideAction: { none: {} },
          statement: { managedRuleGroupStatement: { vendorName: 'AWS', name: 'AWSManagedRulesKnownBadInputsRuleSet' } },
          visibilityConfig: visibility('known-bad-inputs'),
        },
      ],
    });
    webAcl.cfnOptions.condition = useWaf;
    const webAclAssociation = new wafv2.CfnWebACLAssociation(this, 'RestApiWebAclAssociation', {
      // The REST API's stage (its Ref: the stage exists before the association).
      resourceArn: `arn:${Aws.PARTITION}:apigateway:${Aws.REGION}::/restapis/${restApi.restApiId}/stages/${restStage.ref}`,
      webAclArn: webAcl.attrArn,
    });
    webAclAssociation.cfnOptions.condition = useWaf;
    // WAF logs only to groups named aws-waf-logs-*.
    const webAclLogGroup = logGroup('RestApiWebAclLogGroup', `aws-waf-logs-${Aws.STACK_NAME}-rest-api`);
    (webAclLogGroup.node.defaultChild as logs.CfnLogGroup).cfnOptions.condition = useWaf;
    const webAclLogging = new wafv2.CfnLoggingConfiguration(this, 'RestApiWebAclLogging', {
      resourceArn: webAcl.attrArn,
      logDestinationConfigs: [
        `arn:${Aws.PARTITION}:logs:${Aws.REGION}:${Aws.ACCOUNT_ID}:log-group:${webAclLogGroup.logGroupName}`,
      ],
    });
    webAclLogging.cfnOptions.condition = useWaf;

    // API Gateway's own errors (403 of a bad signature, 413, 429 of throttling, 5xx) carry the origin
    // too, so that a browser may read them (SAM: the Api's GatewayResponses).
    for (const [logicalId, type] of [
      ['RestApiDefault4xxResponse', apigateway.ResponseType.DEFAULT_4XX],
      ['RestApiDefault5xxResponse', apigateway.ResponseType.DEFAULT_5XX],
    ] as const) {
      const response = restApi.addGatewayResponse(logicalId, {
        type,
        responseHeaders: { 'Access-Control-Allow-Origin': `'${corsAllowOrigin.valueAsString}'` },
      });
      (response.node.defaultChild as apigateway.CfnGatewayResponse).overrideLogicalId(logicalId);
    }

    // ---------------------------------------------------------------------------------------------
    // Alarms and the dashboard.
    // ---------------------------------------------------------------------------------------------
    // The topic, encrypted with a key of its own: CloudWatch alarms cannot publish to a topic under the
    // AWS-managed key aws/sns (its key policy cannot name CloudWatch), so this key's policy lets
    // CloudWatch use it for the topic, and the account administer it.
    const alarmTopicKey = new kms.CfnKey(this, 'AlarmTopicKey', {
      description: `Encrypts the alarm topic of the stack ${Aws.STACK_NAME} (SNS), which CloudWatch alarms publish to`,
      enableKeyRotation: true,
      keyPolicy: {
        Version: '2012-10-17',
        Statement: [
          {
            Sid: 'AccountAdministersTheKey',
            Effect: 'Allow',
            Principal: { AWS: `arn:${Aws.PARTITION}:iam::${Aws.ACCOUNT_ID}:root` },
            Action: 'kms:*',
            Resource: '*',
          },
          {
            Sid: 'CloudWatchAlarmsPublish',
            Effect: 'Allow',
            Principal: { Service: 'cloudwatch.amazonaws.com' },
            Action: ['kms:Decrypt', 'kms:GenerateDataKey*'],
            Resource: '*',
          },
        ],
      },
    });
    alarmTopicKey.cfnOptions.condition = createAlarmTopic;
    const alarmTopic = new sns.CfnTopic(this, 'AlarmTopic', {
      displayName: `${Aws.STACK_NAME} alarms`,
      kmsMasterKeyId: alarmTopicKey.ref,
    });
    alarmTopic.cfnOptions.condition = createAlarmTopic;
    /** The topic every alarm notifies: AlarmActionArn, or the stack's own. */
    const alarmTopicArn = Fn.conditionIf(createAlarmTopic.logicalId, alarmTopic.ref, alarmActionArn.valueAsString);
    // REST has no metric of its own for 429: this filter counts the access log's lines of status 429
    // (stage throttling, ApiThrottlingRateLimit and ApiThrottlingBurstLimit), in a namespace of their own.
    const accessLogsNamespace = `TwoPhaseCommit/${Aws.STACK_NAME}/AccessLogs`;
    new logs.CfnMetricFilter(this, 'RestApiThrottledFilter', {
      logGroupName: restApiAccessLogGroup.logGroupName,
      filterPattern: '{ $.status = "429" }',
      metricTransformations: [
        { metricNamespace: accessLogsNamespace, metricName: 'RestApiThrottled', metricValue: '1', unit: 'Count' },
      ],
    });
    // The 4xx answers that are no normal outcome, counted in the access log: every 4xx but 409 (a
    // transaction ABORTED because a participant refused, NOT_HELD, a decision already taken: the protocol's
    // answers under contention) and 404 (GET of an id that is unknown, expired or another caller's). API
    // Gateway's 4XXError metric counts them all.
    new logs.CfnMetricFilter(this, 'RestApiClientErrorsFilter', {
      logGroupName: restApiAccessLogGroup.logGroupName,
      filterPattern: '{ $.status = "4*" && $.status != "409" && $.status != "404" }',
      metricTransformations: [
        { metricNamespace: accessLogsNamespace, metricName: 'RestApiClientErrors', metricValue: '1', unit: 'Count' },
      ],
    });
    const monitoring = new Monitoring(this, {
      alarmAction: [alarmTopicArn],
      accessLogsNamespace,
      metricsNamespace,
      coordinator,
      participants,
      sweeper,
      streamProcessor,
      outcomes,
      connections,
      authorizer,
      useJwt,
      streamFailureQueue,
      outcomesFailureQueue,
      restApiName,
      restApiStage: apiStageName.valueAsString,
      webSocketApiId: webSocketApi.ref,
      webSocketStage: webSocketStageName.valueAsString,
      lakeDeliveryStream,
      transactionsTable,
      connectionsTable,
    });

    // ---------------------------------------------------------------------------------------------
    // Outputs: the SAM template's, by the same names.
    // ---------------------------------------------------------------------------------------------
    const output = (name: string, description: string, value: string) => {
      const o = new CfnOutput(this, `${name}Output`, { description, value });
      o.overrideLogicalId(name);
      return o;
    };
    output(
      'RestApiUrl',
      'REST API base URL (POST /transactions, GET /transactions/{id}, POST /transactions/{id}/commit and /abort); ' +
        'requests are SigV4-signed (execute-api), or carry a JWT (Authorization header) when JwtIssuer is set',
      `https://${restApi.restApiId}.execute-api.${Aws.REGION}.${Aws.URL_SUFFIX}/${apiStageName.valueAsString}`,
    );
    output(
      'WebSocketUrl',
      'WebSocket URL for clients (SigV4-signed $connect, or a JWT as the token query parameter or the ' +
        'Authorization header when JwtIssuer is set)',
      `wss://${webSocketHost}`,
    );
    output(
      'WebSocketManagementEndpoint',
      'WebSocket management (@connections) endpoint used by the stream processor',
      `https://${webSocketHost}`,
    );
    output('LakeBucketName', 'S3 bucket of the data lake (data/YYYY/MM/DD/HH/*.gz, errors/...)', lakeBucket.ref);
    output('LakeDeliveryStreamName', 'Firehose delivery stream of committed changes', lakeDeliveryStream.ref);
    output(
      'LakeTable',
      'Athena table of the lake (database.table), partitioned by year, month, day, hour',
      `${lakeDatabase.ref}.changes`,
    );
    output('DashboardName', "CloudWatch dashboard of the protocol's health", monitoring.dashboardName);
    // The output names AlarmTopic only under its own condition (Fn::If CreateAlarmTopic).
    Validations.of(this).acknowledge({
      id: 'CloudFormation-Validate::W1001',
      reason: 'AlarmTopicArn names AlarmTopic inside Fn::If CreateAlarmTopic, the condition AlarmTopic is created under',
    });
    output(
      'AlarmTopicArn',
      "The SNS topic every alarm notifies (the stack's own, encrypted, unless AlarmActionArn names one); subscribe to it (infra/DEPLOY.md, Alarms)",
      alarmTopicArn.toString(),
    );
    output('LakeAuditBucketName', "S3 bucket of the lake's access logs (s3-access/ or cloudtrail/, by LakeAccessLogging)", lakeAuditBucket.ref);
    output('RestApiAccessLogGroupName', "Access log of the REST API's stage (JSON, one line per request)", restApiAccessLogGroup.logGroupName);
    output(
      'WebSocketAccessLogGroupName',
      "Access log of the WebSocket API's stage (JSON, one line per message)",
      webSocketAccessLogGroup.logGroupName,
    );
    output('RestApiWebAclArn', "The AWS WAF web ACL of the REST API's stage (WafEnabled)", webAcl.attrArn).condition = useWaf;
    output('StreamFailureQueueUrl', "On-failure destination of the stream processor's event sources", streamFailureQueue.ref);
    output(
      'OutcomesEventBusName',
      'EventBridge bus of the transaction outcomes (source twopc; deduplicate on detail.outcomeId); operators only (infra/DEPLOY.md, Outcome events)',
      outcomesEventBus.ref,
    );
    output(
      'OutcomesEventBusArn',
      "ARN of the EventBridge bus of the transaction outcomes (for operators' rules)",
      outcomesEventBus.attrArn,
    );
    output(
      'OutcomeHistoryLogGroupName',
      'The terminal outcomes the outcomes bus\'s rule writes, which GET /admin/outcomes reads (operators only)',
      outcomeHistoryLogGroup.logGroupName,
    );
    output(
      'OutcomesFailureQueueUrl',
      "On-failure destination of the outcomes function's event source (outcome events not sent)",
      outcomesFailureQueue.ref,
    );
    output('TransactionsTableName', 'Transactions table', transactionsTable.ref);
    for (const p of participants) {
      output(`Service${p.service.key}TableName`, `Data table of the ${p.service.ordinal} participant service`, p.table.ref);
    }
    output('ConnectionsTableName', 'WebSocket connections table', connectionsTable.ref);
    output('CoordinatorFunctionName', 'Coordinator function', coordinator.functionName);
    for (const p of participants) {
      output(
        `Participant${p.service.key}FunctionName`,
        `Participant function of the ${p.service.ordinal} service`,
        p.function.functionName,
      );
    }
    for (const p of participants) {
      output(
        `Participant${p.service.key}LiveAlias`,
        `The alias \`${ALIAS_NAME}\` of the ${p.service.ordinal} participant (what the registries name)`,
        p.alias.functionArn,
      );
    }
    for (const p of participants) {
      output(
        `Service${p.service.key}MessageKeyArn`,
        `Secret of the ${p.service.ordinal} participant service's message key (rotate it as infra/DEPLOY.md says)`,
        p.key.ref,
      );
    }
    output(
      'CoordinatorRoleArn',
      "The coordinator's role, one of the two principals the participants' resource policies name",
      coordinatorRole.attrArn,
    );
    output('SweeperRoleArn', "The sweeper's role, the other principal the participants' resource policies name", sweeperRole.attrArn);
    output('SweeperFunctionName', 'Sweeper function', sweeper.functionName);
    output('StreamProcessorFunctionName', 'Stream processor function', streamProcessor.functionName);
    output('OutcomesFunctionName', 'Outcomes function (transaction outcomes to the outcomes event bus)', outcomes.functionName);
    output('ConnectionsFunctionName', 'WebSocket connections function', connections.functionName);
    output('AuthorizerFunctionName', 'JWT authorizer function of both APIs (JwtIssuer set)', authorizer.functionName).condition =
      useJwt;
  }
}

// -------------------------------------------------------------------------------------------------
// Monitoring
// -------------------------------------------------------------------------------------------------

interface MonitoringProps {
  /** AlarmActions of every alarm: [Fn::If CreateAlarmTopic, the stack's topic, AlarmActionArn]. */
  readonly alarmAction: unknown;
  /** The namespace of the metrics counted from the access logs (RestApiThrottled). */
  readonly accessLogsNamespace: string;
  readonly metricsNamespace: string;
  readonly coordinator: lambda.Function;
  readonly participants: readonly Participant[];
  readonly sweeper: lambda.Function;
  readonly streamProcessor: lambda.Function;
  /** The outcomes function: the transactions stream's second reader. */
  readonly outcomes: lambda.Function;
  readonly connections: lambda.Function;
  /** The JWT authorizer: it exists only under `useJwt`. */
  readonly authorizer: lambda.Function;
  readonly useJwt: CfnCondition;
  readonly streamFailureQueue: sqs.CfnQueue;
  readonly outcomesFailureQueue: sqs.CfnQueue;
  readonly restApiName: string;
  readonly restApiStage: string;
  readonly webSocketApiId: string;
  readonly webSocketStage: string;
  readonly lakeDeliveryStream: firehose.CfnDeliveryStream;
  readonly transactionsTable: dynamodb.CfnTable;
  readonly connectionsTable: dynamodb.CfnTable;
}

/** An alarm's properties; the comparison is "greater than" and missing data not breaching unless given. */
type AlarmOptions = cloudwatch.AlarmProps;

/**
 * The alarms and the dashboard of the protocol's health. Every alarm notifies AlarmActionArn (when
 * set) and treats missing data as not breaching: each metric is only published when something
 * happens (an invocation, a request, a delivery, a throttle), so no data means nothing went wrong.
 * What each alarm means and what to do: infra/DEPLOY.md, "Alarms".
 */
class Monitoring {
  readonly dashboardName: string;
  private readonly alarms: cloudwatch.Alarm[] = [];
  private readonly fiveMinutes = Duration.minutes(5);
  private readonly minute = Duration.minutes(1);

  constructor(
    private readonly stack: Stack,
    private readonly props: MonitoringProps,
  ) {
    const { coordinator, participants, sweeper, streamProcessor, outcomes, connections, authorizer, useJwt } = props;
    /** Every function that is always deployed, by dashboard label and alarm prefix. */
    const deployed: Array<[string, string, lambda.Function]> = [
      ['coordinator', 'Coordinator', coordinator],
      ...participants.map((p): [string, string, lambda.Function] => [
        `participant ${p.service.fixedName ? p.service.defaultName : p.service.key}`,
        `Participant${p.service.key}`,
        p.function,
      ]),
      ['sweeper', 'Sweeper', sweeper],
      ['stream processor', 'StreamProcessor', streamProcessor],
      ['outcomes', 'Outcomes', outcomes],
      ['connections', 'Connections', connections],
    ];
    /** Every function's name, by dashboard label: the authorizer's rows name it only when it is
     * deployed (JwtIssuer set); otherwise they graph nothing. */
    const functions: Array<[string, string]> = [
      ...deployed.map(([label, , f]): [string, string] => [label, f.functionName]),
      [
        'authorizer (JwtIssuer set)',
        Fn.conditionIf(useJwt.logicalId, authorizer.functionName, 'no-authorizer-deployed').toString(),
      ],
    ];

    // --- the first template's three alarms ------------------------------------------------------------
    this.alarm('StreamFailuresAlarm', {
      alarmDescription:
        'A message is in the on-failure queue: the stream event sources gave up on records that failed ' +
        'for 22 h (described by shard and sequence range; the stream trims them at 24 h), or the stream ' +
        'processor dead-lettered a record itself, with its content (UnprocessableRecordsAlarm). ' +
        'Committed changes are missing from the lake and WebSocket clients. Fix the cause, then invoke ' +
        'the stream processor with {"action": "replay-dead-letters"} (infra/DEPLOY.md, "When the ' +
        'fan-out falls behind or gives up").',
      metric: new cloudwatch.Metric({
        namespace: 'AWS/SQS',
        metricName: 'ApproximateNumberOfMessagesVisible',
        dimensionsMap: { QueueName: props.streamFailureQueue.attrQueueName },
        statistic: 'Maximum',
        period: this.minute,
      }),
      evaluationPeriods: 1,
      threshold: 0,
    });
    this.alarm('OutcomesFailuresAlarm', {
      alarmDescription:
        "A message is in the outcomes on-failure queue: the outcomes function's event source gave up on " +
        'records of the transactions stream (described by shard and sequence range, not the records), so ' +
        'outcome events of those transactions were not sent to the outcomes bus. Read the outcomes log ' +
        'group for why, fix the cause, then send the missing outcomes again within two hours, while the ' +
        'stream still has the records (infra/DEPLOY.md, "Outcome events").',
      metric: new cloudwatch.Metric({
        namespace: 'AWS/SQS',
        metricName: 'ApproximateNumberOfMessagesVisible',
        dimensionsMap: { QueueName: props.outcomesFailureQueue.attrQueueName },
        statistic: 'Maximum',
        period: this.minute,
      }),
      evaluationPeriods: 1,
      threshold: 0,
    });
    this.alarm('StuckTransactionsAlarm', {
      alarmDescription:
        'The sweeper has found open transactions past their deadline that it could not finish in ' +
        'every run for 5 minutes: recovery is not making progress (participant down, throttling, a ' +
        "bug, or a resource participant's confirm failing for good, such as a capture the payment API " +
        "keeps refusing). Each stuck record's sweepError says why (for a confirm, the resource's " +
        'answer); the sweeper keeps retrying with backoff. Never abort by hand after a commit decision ' +
        '(COMMITTING): fix the cause and the next sweep commits; an authorization stays held until its ' +
        'capture succeeds (infra/DEPLOY.md, A resource participant).',
      // Emitted by the sweeper as CloudWatch embedded metric format lines, no dimensions, in the
      // stack's namespace (its METRICS_NAMESPACE).
      metric: this.protocol('StuckTransactions', 'Minimum'),
      evaluationPeriods: 5,
      datapointsToAlarm: 5,
      threshold: 0,
    });
    this.alarm('StuckViewAlarm', {
      alarmDescription:
        "The operators' stuck view has listed something after every sweep for 15 minutes: open " +
        "transactions past their sweeper's due time, or locks expired a minute ago or more whose owner has " +
        'no record or has ended, that recovery has not cleared. GET /admin/stuck (or twopc-local admin ' +
        'stuck --api <ApiUrl>) lists them with why; a held transaction is not counted before its ' +
        'holdUntil (infra/DEPLOY.md, "Alarms").',
      // The sweeper's gauge after each run (embedded metric format, no dimension).
      metric: this.protocol('StuckViewCount', 'Minimum'),
      evaluationPeriods: 15,
      datapointsToAlarm: 15,
      threshold: 0,
    });
    this.alarm('ClockSkewAlarm', {
      alarmDescription:
        "A participant's clock was more than 50 ms from the coordinator's (ClockSkew maximum over 5 " +
        'minutes, measured on every answered prepare), a fifth of the clock margin M = 250 ms that the ' +
        "protocol tolerates. Compare the Lambda instances' clocks (the coordinator's log names the " +
        'service whose clock is off); a skew beyond M costs aborts, not safety (every decision is a ' +
        'conditional write).',
      // Emitted by the coordinator as CloudWatch embedded metric format lines, no dimensions, in the
      // stack's namespace (its METRICS_NAMESPACE); milliseconds, absolute value.
      metric: this.protocol('ClockSkew', 'Maximum', undefined, this.fiveMinutes),
      evaluationPeriods: 1,
      threshold: 50,
    });
    this.alarm('UnprocessableRecordsAlarm', {
      alarmDescription:
        'The stream processor gave up on a stream record in the last 5 minutes (one it cannot judge, ' +
        'or a commit too large for Firehose): the record was dead-lettered with its content to the ' +
        "on-failure queue and its shard went on. Read the stream processor's log line (it names the " +
        "record's keys and why), fix the cause, then invoke the stream processor with " +
        '{"action": "replay-dead-letters"}.',
      // Emitted by the stream processor as CloudWatch embedded metric format lines, no dimensions, in
      // the stack's namespace (its METRICS_NAMESPACE).
      metric: this.protocol('UnprocessableRecords', 'Sum', undefined, this.fiveMinutes),
      evaluationPeriods: 1,
      threshold: 1,
      comparisonOperator: cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
    });
    this.alarm('SweeperErrorsAlarm', {
      alarmDescription:
        'The sweeper failed in 3 consecutive runs; stuck transactions are not being recovered. (One ' +
        'failed run is not alarmed: the next run, a minute later, does its work.)',
      metric: this.lambdaMetric(sweeper.functionName, 'Errors', 'Sum', this.minute),
      evaluationPeriods: 3,
      datapointsToAlarm: 3,
      threshold: 0,
    });

    // The sweeper's own count of what failed during its runs (a participant that did not answer, a store
    // error): each such transaction is postponed with sweepError on its record.
    this.alarm('SweepErrorsAlarm', {
      alarmDescription:
        'The sweeper met errors in the last 5 minutes (SweepErrors): a participant that did not answer ' +
        'or failed, a store error. Each transaction concerned is postponed with sweepError on its ' +
        "record and retried with backoff; read sweepError and the sweeper's log group.",
      // Emitted by the sweeper as CloudWatch embedded metric format lines, no dimensions, in the
      // stack's namespace (its METRICS_NAMESPACE).
      metric: this.protocol('SweepErrors', 'Sum', undefined, this.fiveMinutes),
      evaluationPeriods: 1,
      threshold: 0,
    });
    // The schedule invokes the sweeper every minute: fewer than one invocation in 5 minutes, or none
    // recorded at all (missing data), is the sweeper not running.
    this.alarm('SweeperNotRunningAlarm', {
      alarmDescription:
        'The sweeper was not invoked in the last 5 minutes (its schedule runs it every minute): nothing ' +
        'finishes stuck transactions or resolves expired locks. Check the schedule rule (enabled, its ' +
        "target, the permission to invoke the sweeper) and the sweeper's throttles.",
      metric: this.lambdaMetric(sweeper.functionName, 'Invocations', 'Sum'),
      evaluationPeriods: 1,
      threshold: 1,
      comparisonOperator: cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
      treatMissingData: cloudwatch.TreatMissingData.BREACHING,
    });

    // --- every function's errors and throttles -------------------------------------------------------
    // The handlers answer every failure they know of (4xx, 503, votes, item failures), so a Lambda
    // error is a crash, a timeout or an out-of-memory: the threshold is 0.
    const errors: Array<[string, lambda.Function, string]> = [
      [
        'Coordinator',
        coordinator,
        'The coordinator crashed or timed out (Lambda Errors) in the last 5 minutes. It answers every ' +
          'failure it knows of with an HTTP status (4xx, 503), so any function error is a bug, a timeout ' +
          'or an out-of-memory: read its log group.',
      ],
      ...participants.map((p): [string, lambda.Function, string] => [
        `Participant${p.service.key}`,
        p.function,
        `The ${p.service.ordinal} participant failed invocations in the last 5 minutes. Participants answer ` +
          'refusals as votes, so a function error is a bug, a timeout, an out-of-memory, or a message it ' +
          'refused as not signed with its key (its log says "message refused" and why: an unsigned, forged ' +
          'or stale message, or a key it could not read); the coordinator aborts (or the sweeper retries) ' +
          'the transactions concerned.' +
          (p.service.resource
            ? ' A failing resource (a payment API) is no function error: a try is answered as a vote, a ' +
              'confirm or a cancel as FAILED and retried (StuckTransactionsAlarm when a confirm keeps failing).'
            : ''),
      ]),
      [
        'StreamProcessor',
        streamProcessor,
        'The stream processor failed whole batches in the last 5 minutes (records it cannot deliver are ' +
          'reported as item failures, not errors): the batches are retried and bisected, then sent to the ' +
          'on-failure queue. Read its log group.',
      ],
      [
        'Outcomes',
        outcomes,
        'The outcomes function failed whole batches in the last 5 minutes (events EventBridge refused are ' +
          'reported as item failures, not errors): the batches are retried and bisected, then described in ' +
          'the outcomes on-failure queue. Read its log group.',
      ],
      [
        'Connections',
        connections,
        'The WebSocket connections function crashed or timed out in the last 5 minutes: clients could ' +
          'not connect, subscribe or unsubscribe. Read its log group.',
      ],
    ];
    for (const [prefix, f, description] of errors) {
      this.alarm(`${prefix}ErrorsAlarm`, {
        alarmDescription: description,
        metric: this.lambdaMetric(f.functionName, 'Errors', 'Sum'),
        evaluationPeriods: 1,
        threshold: 0,
      });
    }
    // The authorizer answers every refused token with the error API Gateway turns into 401, so its
    // Errors count refusals too: the alarm watches the share of its calls that failed, not their count.
    this.alarm(
      'AuthorizerErrorsAlarm',
      {
        alarmDescription:
          "More than half of the JWT authorizer's calls failed in the last 5 minutes (at least 10 calls). " +
          'It answers a refused token (none, expired, forged, of another issuer or audience) with the ' +
          "error API Gateway turns into 401, and a failure to fetch the issuer's keys (JWKS) with a " +
          'function error (500), so its Errors count both. Mostly failing: the issuer\'s JWKS unreachable ' +
          '(every caller gets 500), a bad configuration (JWT_ISSUER, JWT_AUDIENCE, ACCESS_POLICY: the ' +
          'function does not start), or a flood of bad tokens. Read its log group: each refusal is logged ' +
          'with its reason.',
        // A few refused tokens among few calls are no outage: at least 10 calls.
        metric: new cloudwatch.MathExpression({
          expression: 'IF(invocations >= 10, 100 * FILL(errors, 0) / invocations, 0)',
          usingMetrics: {
            errors: this.lambdaMetric(authorizer.functionName, 'Errors', 'Sum'),
            invocations: this.lambdaMetric(authorizer.functionName, 'Invocations', 'Sum'),
          },
          period: this.fiveMinutes,
          label: "Share of the authorizer's calls that failed (%)",
        }),
        evaluationPeriods: 1,
        threshold: 50,
      },
      useJwt,
    );
    const throttles: Array<[string, lambda.Function, string]> = [
      [
        'Coordinator',
        coordinator,
        'Lambda throttled the coordinator (above its reserved concurrency, CoordinatorReservedConcurrency): callers get 429/5xx.',
      ],
      ...participants.map((p): [string, lambda.Function, string] => [
        `Participant${p.service.key}`,
        p.function,
        `Lambda throttled the ${p.service.ordinal} participant (the account's concurrency is exhausted): prepares fail and transactions abort.`,
      ]),
      ['Sweeper', sweeper, 'Lambda throttled the sweeper (above SweeperReservedConcurrency): recovery is delayed.'],
      [
        'StreamProcessor',
        streamProcessor,
        'Lambda throttled the stream processor (above StreamProcessorReservedConcurrency): the fan-out falls behind.',
      ],
      [
        'Outcomes',
        outcomes,
        "Lambda throttled the outcomes function (the account's concurrency is exhausted): outcome events fall behind.",
      ],
      [
        'Connections',
        connections,
        "Lambda throttled the connections function (the account's concurrency is exhausted): WebSocket clients are refused.",
      ],
    ];
    for (const [prefix, f, description] of throttles) {
      this.alarm(`${prefix}ThrottlesAlarm`, {
        alarmDescription: description,
        metric: this.lambdaMetric(f.functionName, 'Throttles', 'Sum'),
        evaluationPeriods: 1,
        threshold: 0,
      });
    }
    this.alarm(
      'AuthorizerThrottlesAlarm',
      {
        alarmDescription:
          "Lambda throttled the JWT authorizer (the account's concurrency is exhausted): callers of both APIs are refused.",
        metric: this.lambdaMetric(authorizer.functionName, 'Throttles', 'Sum'),
        evaluationPeriods: 1,
        threshold: 0,
      },
      useJwt,
    );
    this.alarm('StreamProcessorIteratorAgeAlarm', {
      alarmDescription:
        'The stream processor is more than a minute behind its streams (IteratorAge maximum over 5 ' +
        'minutes): the lake and WebSocket clients see commits late (a Firehose or WebSocket outage, the ' +
        "processor's errors or throttles). Records are retried until 24 h old, then go to the " +
        'on-failure queue.',
      metric: this.lambdaMetric(streamProcessor.functionName, 'IteratorAge', 'Maximum'),
      evaluationPeriods: 1,
      threshold: 60000,
    });
    this.alarm('OutcomesIteratorAgeAlarm', {
      alarmDescription:
        'The outcomes function is more than a minute behind the transactions stream (IteratorAge maximum ' +
        'over 5 minutes): outcome events reach the bus late (EventBridge refusing or throttling PutEvents, ' +
        "the function's errors or throttles). Records are retried (up to 10000 times) until 22 h old, then " +
        'go to the outcomes on-failure queue.',
      metric: this.lambdaMetric(outcomes.functionName, 'IteratorAge', 'Maximum'),
      evaluationPeriods: 1,
      threshold: 60000,
    });

    // --- APIs --------------------------------------------------------------------------------------------
    this.alarm('RestApi5xxAlarm', {
      alarmDescription:
        "The REST API answered 5xx in the last 5 minutes: the coordinator's 503s (a participant or the " +
        "transactions table unavailable), API Gateway's own errors or the 29 s integration timeout.",
      metric: this.restMetric('5XXError', 'Sum'),
      evaluationPeriods: 1,
      threshold: 0,
    });
    this.alarm('RestApiLatencyAlarm', {
      alarmDescription:
        "The REST API's p99 latency over 5 minutes is above 25 s, the coordinator's prepare budget: " +
        "answers are running into the 27 s deadline (202 answers) or API Gateway's 29 s timeout.",
      metric: this.restMetric('Latency', 'p99'),
      evaluationPeriods: 1,
      threshold: 25000,
    });
    this.alarm('RestApi4xxAlarm', {
      alarmDescription:
        "More than 10% of the REST API's requests were answered 4xx other than 409 and 404 in the last 5 " +
        'minutes (at least 20 requests; counted in the access log by RestApiClientErrorsFilter): refused ' +
        'signatures or tokens (403, 401), WAF blocks, throttling (429), requests the coordinator refused ' +
        '(400, 403 by the access policy, 422 a reused idempotency key). 409 (aborted, not held, already decided) and 404 (an unknown or ' +
        "expired id) are the protocol's normal answers and not counted. A jump means misbehaving " +
        'callers, an attack or a broken client release: the access log (status, caller) says which.',
      metric: new cloudwatch.MathExpression({
        expression: 'IF(requests >= 20, 100 * FILL(errors, 0) / requests, 0)',
        usingMetrics: {
          errors: new cloudwatch.Metric({
            namespace: props.accessLogsNamespace,
            metricName: 'RestApiClientErrors',
            statistic: 'Sum',
            period: this.fiveMinutes,
          }),
          requests: this.restMetric('Count', 'Sum'),
        },
        period: this.fiveMinutes,
        label: "Share of the REST API's requests answered 4xx but 409 and 404 (%)",
      }),
      evaluationPeriods: 1,
      threshold: 10,
    });
    this.alarm('RestApi429Alarm', {
      alarmDescription:
        "More than 1% of the REST API's requests were throttled (429) in the last 5 minutes (at least " +
        '20 requests; counted in the access log by RestApiThrottledFilter): callers exceed the stage\'s ' +
        'ApiThrottlingRateLimit and ApiThrottlingBurstLimit. Raise them if the load is legitimate, or ' +
        'find the caller in the access log.',
      metric: new cloudwatch.MathExpression({
        expression: 'IF(requests >= 20, 100 * FILL(throttled, 0) / requests, 0)',
        usingMetrics: {
          throttled: new cloudwatch.Metric({
            namespace: props.accessLogsNamespace,
            metricName: 'RestApiThrottled',
            statistic: 'Sum',
            period: this.fiveMinutes,
          }),
          requests: this.restMetric('Count', 'Sum'),
        },
        period: this.fiveMinutes,
        label: "Share of the REST API's requests throttled (%)",
      }),
      evaluationPeriods: 1,
      threshold: 1,
    });
    this.alarm('WebSocketExecutionErrorsAlarm', {
      alarmDescription:
        'The WebSocket API failed to call its integration in the last 5 minutes (ExecutionError: the ' +
        'connections function could not be invoked, its permission, throttling): clients could not ' +
        'connect, subscribe or unsubscribe.',
      metric: this.webSocketMetric('ExecutionError'),
      evaluationPeriods: 1,
      threshold: 0,
    });
    this.alarm('WebSocketErrorsAlarm', {
      alarmDescription:
        "The WebSocket API's integration (the connections function) answered errors in the last 5 " +
        'minutes: clients could not connect, subscribe or unsubscribe.',
      metric: this.webSocketMetric('IntegrationError'),
      evaluationPeriods: 1,
      threshold: 0,
    });

    // --- the lake and the tables -----------------------------------------------------------------------
    this.alarm('LakeFreshnessAlarm', {
      alarmDescription:
        'The oldest record in Firehose is more than 15 minutes old (DeliveryToS3.DataFreshness): the ' +
        'lake is not being written (bucket policy, role, S3 errors; see the delivery log group).',
      metric: this.freshness(this.fiveMinutes),
      evaluationPeriods: 1,
      threshold: 900,
    });
    const tables: Array<[string, dynamodb.CfnTable, string]> = [
      [
        'Transactions',
        props.transactionsTable,
        'DynamoDB throttled reads or writes of the transactions table: the coordinator and sweeper retry, ' +
          'then answer 503 (hot keys or partitions above their limits).',
      ],
      ...participants.map((p): [string, dynamodb.CfnTable, string] => [
        `Service${p.service.key}`,
        p.table,
        `DynamoDB throttled reads or writes of the ${p.service.ordinal} participant's data table: prepares ` +
          'and commits are retried or refused (hot keys or partitions above their limits).',
      ]),
      [
        'Connections',
        props.connectionsTable,
        'DynamoDB throttled reads or writes of the connections table: WebSocket subscriptions and pushes ' +
          'fail (hot keys or partitions above their limits).',
      ],
    ];
    for (const [prefix, t, description] of tables) {
      this.alarm(`${prefix}TableThrottlesAlarm`, {
        alarmDescription: description,
        metric: this.tableThrottles(t, this.fiveMinutes),
        evaluationPeriods: 1,
        threshold: 0,
      });
    }

    this.dashboardName = this.dashboard(functions, tables);
  }

  // --- metrics ---------------------------------------------------------------------------------------

  private protocol(metricName: string, statistic: string, label?: string, period = this.minute) {
    return new cloudwatch.Metric({
      namespace: this.props.metricsNamespace,
      metricName,
      statistic,
      period,
      label,
    });
  }

  private lambdaMetric(functionName: string, metricName: string, statistic: string, period = this.fiveMinutes) {
    return new cloudwatch.Metric({
      namespace: 'AWS/Lambda',
      metricName,
      dimensionsMap: { FunctionName: functionName },
      statistic,
      period,
    });
  }

  private restMetric(metricName: string, statistic: string, period = this.fiveMinutes) {
    return new cloudwatch.Metric({
      namespace: 'AWS/ApiGateway',
      metricName,
      dimensionsMap: { ApiName: this.props.restApiName, Stage: this.props.restApiStage },
      statistic,
      period,
    });
  }

  private webSocketMetric(metricName: string, period = this.fiveMinutes) {
    return new cloudwatch.Metric({
      namespace: 'AWS/ApiGateway',
      metricName,
      dimensionsMap: { ApiId: this.props.webSocketApiId, Stage: this.props.webSocketStage },
      statistic: 'Sum',
      period,
    });
  }

  private freshness(period: Duration) {
    return new cloudwatch.Metric({
      namespace: 'AWS/Firehose',
      metricName: 'DeliveryToS3.DataFreshness',
      dimensionsMap: { DeliveryStreamName: this.props.lakeDeliveryStream.ref },
      statistic: 'Maximum',
      period,
    });
  }

  /** Read plus write throttle events of a table (either alone may have no data point). The ids of
   * the two metrics end in `suffix`: a dashboard graph holds several tables' sums. */
  private tableThrottles(t: dynamodb.CfnTable, period: Duration, label = 'Throttled reads and writes', suffix = '') {
    const events = (metricName: string) =>
      new cloudwatch.Metric({
        namespace: 'AWS/DynamoDB',
        metricName,
        dimensionsMap: { TableName: t.ref },
        statistic: 'Sum',
        period,
      });
    return new cloudwatch.MathExpression({
      expression: `FILL(reads${suffix}, 0) + FILL(writes${suffix}, 0)`,
      usingMetrics: { [`reads${suffix}`]: events('ReadThrottleEvents'), [`writes${suffix}`]: events('WriteThrottleEvents') },
      period,
      label,
    });
  }

  // --- alarms ----------------------------------------------------------------------------------------

  /** An alarm; one with a `condition` exists only under it, and so is left out of the alarm status
   * widget (which would name it whether or not it exists). */
  private alarm(logicalId: string, options: AlarmOptions, condition?: CfnCondition) {
    const alarm = new cloudwatch.Alarm(this.stack, logicalId, {
      comparisonOperator: cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
      treatMissingData: cloudwatch.TreatMissingData.NOT_BREACHING,
      ...options,
    });
    const resource = alarm.node.defaultChild as cloudwatch.CfnAlarm;
    resource.overrideLogicalId(logicalId);
    resource.addPropertyOverride('AlarmActions', this.props.alarmAction);
    // CDK's template validation reads `Ref AlarmActionArn` with its default "" (too short for an ARN)
    // without the CreateAlarmTopic condition around it, which takes the stack's topic in that case.
    Validations.of(alarm).acknowledge({
      id: 'CloudFormation-Validate::W1030',
      reason: "AlarmActions names AlarmActionArn only when it is not empty (condition CreateAlarmTopic); the stack's topic otherwise",
    });
    if (condition) {
      resource.cfnOptions.condition = condition;
    } else {
      this.alarms.push(alarm);
    }
    return alarm;
  }

  // --- dashboard -------------------------------------------------------------------------------------

  private dashboard(
    functions: Array<[string, string]>,
    tables: Array<[string, dynamodb.CfnTable, string]>,
  ): string {
    const props = this.props;
    const minute = this.minute;
    const graph = (title: string, left: cloudwatch.IMetric[], right: cloudwatch.IMetric[] = [], width = 12) =>
      new cloudwatch.GraphWidget({ title, left, right, width, height: 6, period: minute });
    const alarmLine = (value: number) => [{ label: 'alarm', value }];
    const latencies = ['PrepareLatency', 'DecisionLatency', 'CommitLatency', 'TransactionLatency'];

    const dashboard = new cloudwatch.Dashboard(this.stack, 'Dashboard', {
      dashboardName: `${Aws.STACK_NAME}-two-phase-commit`,
      defaultInterval: Duration.hours(3),
    });
    (dashboard.node.defaultChild as cloudwatch.CfnDashboard).overrideLogicalId('Dashboard');
    dashboard.addWidgets(
      new cloudwatch.TextWidget({
        markdown: `## Two-phase commit: ${Aws.STACK_NAME}\nWhat each alarm means and what to do: infra/DEPLOY.md, "Alarms".`,
        width: 24,
        height: 2,
      }),
    );
    dashboard.addWidgets(
      graph('Transactions per minute: committed, aborted by reason', [
        this.protocol('Committed', 'Sum', 'Committed'),
        new cloudwatch.MathExpression({
          // One line per value of the Reason dimension (REFUSED, CONFLICT, TIMEOUT, UNAVAILABLE, ...).
          expression: `SEARCH('{"${props.metricsNamespace}",Reason} MetricName="Aborted"', 'Sum', 60)`,
          usingMetrics: {},
          label: 'Aborted',
          period: minute,
        }),
      ]),
      graph('Unavailable (503) answers per minute', [this.protocol('Unavailable', 'Sum', 'Unavailable')]),
    );
    dashboard.addWidgets(
      graph(
        'Phase latency p50 / p99 (ms)',
        latencies.flatMap((m) => [this.protocol(m, 'p50', `${m} p50`), this.protocol(m, 'p99', `${m} p99`)]),
      ),
      graph(
        'Sweeper: stuck (per run), recovered, locks resolved, errors, open by status, the stuck view; the oldest open (ms, right)',
        [
          this.protocol('StuckTransactions', 'Maximum', 'StuckTransactions'),
          this.protocol('RecoveredTransactions', 'Sum', 'RecoveredTransactions'),
          this.protocol('ResolvedLocks', 'Sum', 'ResolvedLocks'),
          this.protocol('SweepErrors', 'Sum', 'SweepErrors'),
          this.protocol('StuckViewCount', 'Maximum', 'StuckViewCount'),
          new cloudwatch.MathExpression({
            // One line per open status (the Status dimension: PREPARING, PREPARED, COMMITTING, ABORTING).
            expression: `SEARCH('{"${this.props.metricsNamespace}",Status} MetricName="OpenTransactions"', 'Maximum', 60)`,
            usingMetrics: {},
            label: 'OpenTransactions',
            period: minute,
          }),
        ],
        [this.protocol('OldestOpenTransactionAge', 'Maximum', 'OldestOpenTransactionAge')],
      ),
    );
    dashboard.addWidgets(
      new cloudwatch.GraphWidget({
        title: "Stream readers' iterator age (ms): the stream processor, outcomes",
        left: [
          this.lambdaMetric(props.streamProcessor.functionName, 'IteratorAge', 'Maximum', minute).with({
            label: 'stream processor',
          }),
          this.lambdaMetric(props.outcomes.functionName, 'IteratorAge', 'Maximum', minute).with({ label: 'outcomes' }),
        ],
        leftAnnotations: alarmLine(60000),
        width: 8,
        height: 6,
      }),
      graph(
        'Function errors',
        functions.map(([label, f]) => this.lambdaMetric(f, 'Errors', 'Sum', minute).with({ label })),
        [],
        8,
      ),
      graph(
        'Function throttles',
        functions.map(([label, f]) => this.lambdaMetric(f, 'Throttles', 'Sum', minute).with({ label })),
        [],
        8,
      ),
    );
    dashboard.addWidgets(
      graph(
        'REST API: 5XX, p99 latency',
        [this.restMetric('5XXError', 'Sum', minute).with({ label: '5XX' })],
        [this.restMetric('Latency', 'p99', minute).with({ label: 'Latency p99 (ms)' })],
      ),
      new cloudwatch.GraphWidget({
        title: 'Lake: Firehose delivery freshness (s)',
        left: [this.freshness(minute)],
        leftAnnotations: alarmLine(900),
        width: 12,
        height: 6,
      }),
    );
    dashboard.addWidgets(
      new cloudwatch.GraphWidget({
        title: "Participants' clock skew p50 / p99 / maximum (ms; margin M = 250)",
        left: [
          this.protocol('ClockSkew', 'p50', 'ClockSkew p50'),
          this.protocol('ClockSkew', 'p99', 'ClockSkew p99'),
          this.protocol('ClockSkew', 'Maximum', 'ClockSkew maximum'),
        ],
        leftAnnotations: [...alarmLine(50), { label: 'M', value: 250 }],
        width: 12,
        height: 6,
      }),
      graph('Stream processor: records dead-lettered with their content', [
        this.protocol('UnprocessableRecords', 'Sum', 'UnprocessableRecords'),
      ]),
    );
    dashboard.addWidgets(
      graph(
        'WebSocket API errors',
        ['IntegrationError', 'ExecutionError', 'ClientError'].map((m) => this.webSocketMetric(m, minute).with({ label: m })),
      ),
      graph(
        'DynamoDB throttled reads and writes',
        tables.map(([name, t]) => this.tableThrottles(t, minute, name, name)),
      ),
    );
    dashboard.addWidgets(new cloudwatch.AlarmStatusWidget({ title: 'Alarms', alarms: this.alarms, width: 24, height: 6 }));
    return dashboard.dashboardName;
  }
}
