// Unit tests of the CDK app (node --test build/test/, run by infra/cdk/synth.sh). The contract checks
// of infra/tests run on the synthesized template; these cover what only the app can show: the code
// source switch, that no construct slips in a policy, a custom resource or a managed policy, that
// one more entry in lib/services.ts is a whole participant deployment, that the example inventory
// is one running its own binary, its operations reaching the coordinator from
// infra/service-operations.json, that the example payments is a resource participant: its own
// binary, its payment API's URL a parameter, its role on its barrier entries only, and that the JWT
// authorizer and its wiring exist only under the UseJwt condition (IAM otherwise).

import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import { test } from 'node:test';

import { App, DefaultStackSynthesizer } from 'aws-cdk-lib';
import { Template } from 'aws-cdk-lib/assertions';

import { BINARIES, BINARY_METADATA, codeSource, CodeSource, repositoryRoot } from '../lib/code';
import { ParticipantService, SERVICES, serviceOperations } from '../lib/services';
import { TwoPhaseCommitStack } from '../lib/stack';

/** A directory of stand-in zips (<binary>/bootstrap.zip), so the tests need no Rust build. */
function fakeZips(except: string[] = []): string {
  const dir = mkdtempSync(path.join(tmpdir(), 'twopc-cdk-zips-'));
  for (const binary of BINARIES) {
    if (except.includes(binary)) continue;
    mkdirSync(path.join(dir, binary));
    // An empty zip archive (end of central directory only): an asset needs a file, not a build.
    writeFileSync(path.join(dir, binary, 'bootstrap.zip'), Buffer.from([0x50, 0x4b, 0x05, 0x06, ...new Array(18).fill(0)]));
  }
  return dir;
}

const zips = fakeZips();

function synth(
  services?: readonly ParticipantService[],
  code: CodeSource = { kind: 'zips', dir: zips },
  operations?: string,
) {
  const app = new App({ context: { 'aws:cdk:enable-path-metadata': false } });
  const stack = new TwoPhaseCommitStack(app, 'TwoPhaseCommit', {
    code,
    services,
    serviceOperations: operations,
    synthesizer: new DefaultStackSynthesizer({ generateBootstrapVersionRule: false }),
    analyticsReporting: false,
  });
  return Template.fromStack(stack).toJSON() as {
    Parameters: Record<string, unknown>;
    Resources: Record<
      string,
      { Type: string; Properties?: Record<string, unknown>; DeletionPolicy?: string; Metadata?: Record<string, unknown> }
    >;
    Outputs: Record<string, unknown>;
    Rules?: Record<string, unknown>;
    Conditions?: Record<string, unknown>;
  };
}

const template = synth();
const ofType = (t: ReturnType<typeof synth>, type: string) =>
  Object.entries(t.Resources).filter(([, r]) => r.Type === type);

test('no policy resources, managed policies, custom resources or CDK metadata', () => {
  const types = new Set(Object.values(template.Resources).map((r) => r.Type));
  for (const forbidden of ['AWS::IAM::Policy', 'AWS::IAM::ManagedPolicy', 'AWS::SQS::QueuePolicy', 'AWS::CDK::Metadata']) {
    assert.ok(!types.has(forbidden), `${forbidden} in the template`);
  }
  assert.deepEqual(
    [...types].filter((t) => t.startsWith('Custom::') || t === 'AWS::CloudFormation::CustomResource'),
    [],
  );
  for (const [id, role] of ofType(template, 'AWS::IAM::Role')) {
    assert.equal(role.Properties?.ManagedPolicyArns, undefined, `${id} has managed policies`);
  }
  // No bootstrap version check: the template synthesizes and lints without an account. The one rule:
  // a JwtIssuer needs a JwtAudience.
  assert.deepEqual(Object.keys(template.Rules ?? {}), ['JwtAudienceWithIssuer']);
  assert.equal(template.Parameters.BootstrapVersion, undefined);
});

test('one role per function, ten functions on arm64 provided.al2023 with their own log group', () => {
  const functions = ofType(template, 'AWS::Lambda::Function');
  // The authorizer among them, deployed only when JwtIssuer is set; the outcomes function always.
  assert.equal(functions.length, 10);
  const roles = functions.map(([, f]) => JSON.stringify(f.Properties?.Role));
  assert.equal(new Set(roles).size, functions.length);
  const groups = functions.map(([, f]) => JSON.stringify((f.Properties?.LoggingConfig as Record<string, unknown>).LogGroup));
  assert.equal(new Set(groups).size, functions.length);
  for (const [id, f] of functions) {
    assert.deepEqual(f.Properties?.Architectures, ['arm64'], id);
    assert.equal(f.Properties?.Runtime, 'provided.al2023', id);
    assert.equal(f.Properties?.Handler, 'bootstrap', id);
    assert.deepEqual(f.Properties?.TracingConfig, { Mode: { Ref: 'TracingMode' } }, id);
    const env = (f.Properties?.Environment as { Variables: Record<string, unknown> }).Variables;
    assert.equal(env.RUST_LOG, undefined, `${id} sets RUST_LOG`);
  }
});

test('the SAM template logical ids of the main resources', () => {
  for (const id of [
    'TransactionsTable',
    'ServiceATable',
    'ServiceBTable',
    'ConnectionsTable',
    'CoordinatorFunction',
    'ParticipantAFunction',
    'ParticipantAFunctionAliaslive',
    'ServiceAMessageKey',
    'ServiceBMessageKey',
    'ParticipantAInvokeByCoordinator',
    'ParticipantBInvokeBySweeper',
    'SweeperFunction',
    'StreamProcessorFunction',
    'OutcomesFunction',
    'OutcomesFunctionTransactionsStream',
    'OutcomesFailureQueue',
    'OutcomesEventBus',
    'ConnectionsFunction',
    'RestApi',
    'RestApiStage',
    'WebSocketApi',
    'WebSocketStage',
    'LakeBucket',
    'LakeDeliveryStream',
    'LakeTable',
    'Dashboard',
  ]) {
    assert.ok(template.Resources[id], `no ${id}`);
  }
  for (const id of ['TransactionsTable', 'ServiceATable', 'ServiceBTable', 'ConnectionsTable', 'LakeBucket']) {
    assert.equal(template.Resources[id].DeletionPolicy, 'Retain', id);
  }
});

test('CORS: an unsigned preflight on each path, the origin from CorsAllowOrigin everywhere', () => {
  const origin = { 'Fn::Join': ['', ["'", { Ref: 'CorsAllowOrigin' }, "'"]] };
  const preflights = ofType(template, 'AWS::ApiGateway::Method').filter(([, m]) => m.Properties?.HttpMethod === 'OPTIONS');
  // /transactions, /transactions/{id} and its /commit and /abort, and the operators' six paths (the
  // recent outcomes' among them), as SAM's Cors: not the root nor /admin, which serve nothing.
  assert.equal(preflights.length, 10);
  for (const [id, method] of preflights) {
    assert.ok(!JSON.stringify(method.Properties?.ResourceId).includes('RootResourceId'), `${id} is on the root`);
    // The API's default (AWS_IAM) must not reach the preflight: browsers never sign it.
    assert.equal(method.Properties?.AuthorizationType, 'NONE', id);
    const integration = method.Properties?.Integration as {
      Type: string;
      IntegrationResponses: { ResponseParameters: Record<string, unknown>; ResponseTemplates?: unknown }[];
    };
    assert.equal(integration.Type, 'MOCK', id);
    assert.equal(integration.IntegrationResponses.length, 1, id);
    const [response] = integration.IntegrationResponses;
    assert.deepEqual(response.ResponseParameters['method.response.header.Access-Control-Allow-Origin'], origin, id);
    // One origin: a plain header, no VTL choosing among several.
    assert.equal(response.ResponseTemplates, undefined, id);
  }
  const responses = ofType(template, 'AWS::ApiGateway::GatewayResponse');
  assert.deepEqual(responses.map(([, r]) => r.Properties?.ResponseType).sort(), ['DEFAULT_4XX', 'DEFAULT_5XX']);
  for (const [id, response] of responses) {
    const parameters = response.Properties?.ResponseParameters as Record<string, unknown>;
    assert.deepEqual(parameters['gatewayresponse.header.Access-Control-Allow-Origin'], origin, id);
  }
  const coordinatorEnv = (template.Resources.CoordinatorFunction.Properties?.Environment as { Variables: Record<string, unknown> })
    .Variables;
  assert.deepEqual(coordinatorEnv.CORS_ALLOW_ORIGIN, { Ref: 'CorsAllowOrigin' });
});

test('a held transaction: commit and abort authorized as POST /transactions, the hold policy from its parameters', () => {
  const methods = ofType(template, 'AWS::ApiGateway::Method').filter(([, m]) => m.Properties?.HttpMethod === 'POST');
  const pathPart = (method: (typeof methods)[number][1]) => {
    const resource = (method.Properties?.ResourceId as { Ref: string }).Ref;
    return template.Resources[resource].Properties?.PathPart;
  };
  const create = methods.find(([, m]) => pathPart(m) === 'transactions');
  assert.ok(create, 'no POST /transactions');
  assert.deepEqual(create[1].Properties?.AuthorizationType, { 'Fn::If': ['UseJwt', 'CUSTOM', 'AWS_IAM'] });
  for (const decision of ['commit', 'abort']) {
    const method = methods.find(([, m]) => pathPart(m) === decision);
    assert.ok(method, `no POST /transactions/{id}/${decision}`);
    for (const key of ['AuthorizationType', 'AuthorizerId', 'AuthorizationScopes', 'ApiKeyRequired', 'RestApiId']) {
      assert.deepEqual(method[1].Properties?.[key], create[1].Properties?.[key], `${decision}: ${key}`);
    }
    assert.deepEqual(method[1].Properties?.Integration, create[1].Properties?.Integration, decision);
  }
  const variables = (template.Resources.CoordinatorFunction.Properties?.Environment as { Variables: Record<string, unknown> })
    .Variables;
  assert.deepEqual(variables.HOLD_POLICY, { Ref: 'HoldPolicy' });
  assert.deepEqual(variables.MAX_HOLD_MS, { Ref: 'MaxHoldMs' });
  assert.equal((template.Parameters.HoldPolicy as { Default: string }).Default, '{}');
  assert.equal((template.Parameters.MaxHoldMs as { Default: number }).Default, 86400000);
});

test('the JWT authorizer: only with JwtIssuer; then every method and $connect use it, AWS_IAM otherwise', () => {
  assert.deepEqual(template.Conditions?.UseJwt, { 'Fn::Not': [{ 'Fn::Equals': [{ Ref: 'JwtIssuer' }, ''] }] });
  for (const [name, fallback] of [
    ['JwtIssuer', ''],
    ['JwtAudience', ''],
    ['JwksUrl', ''],
    // The example wallets' balances are what non-admins may credit (issue 42).
    ['AccessPolicy', '{"allowCredits": {"service-a": ["balance"], "service-b": ["balance"]}}'],
  ]) {
    assert.equal((template.Parameters[name] as { Default: string }).Default, fallback, name);
  }
  const max = template.Parameters.MaxConnectionsPerPrincipal as { Default: number; MinValue: number; MaxValue: number };
  assert.deepEqual([max.Default, max.MinValue, max.MaxValue], [10, 1, 1000]);
  const conditional = Object.entries(template.Resources)
    .filter(([, r]) => (r as { Condition?: string }).Condition === 'UseJwt')
    .map(([id]) => id)
    .sort();
  assert.deepEqual(conditional, [
    'AuthorizerErrorsAlarm',
    'AuthorizerFunction',
    'AuthorizerInvokeByRestApi',
    'AuthorizerInvokeByWebSocketApi',
    'AuthorizerLogGroup',
    'AuthorizerRole',
    'AuthorizerThrottlesAlarm',
    'RestApiAuthorizer',
    'WebSocketAuthorizer',
  ]);
  const rest = template.Resources.RestApiAuthorizer.Properties;
  assert.equal(rest?.Type, 'REQUEST');
  assert.equal(rest?.IdentitySource, 'method.request.header.Authorization');
  assert.equal(rest?.AuthorizerResultTtlInSeconds, 0);
  const webSocket = template.Resources.WebSocketAuthorizer.Properties;
  assert.equal(webSocket?.AuthorizerType, 'REQUEST');
  assert.equal(webSocket?.IdentitySource, undefined);
  for (const [id, method] of ofType(template, 'AWS::ApiGateway::Method')) {
    if (method.Properties?.HttpMethod === 'OPTIONS') {
      assert.equal(method.Properties?.AuthorizationType, 'NONE', id);
      continue;
    }
    assert.deepEqual(method.Properties?.AuthorizationType, { 'Fn::If': ['UseJwt', 'CUSTOM', 'AWS_IAM'] }, id);
    assert.deepEqual(
      method.Properties?.AuthorizerId,
      { 'Fn::If': ['UseJwt', { Ref: 'RestApiAuthorizer' }, { Ref: 'AWS::NoValue' }] },
      id,
    );
  }
  const connect = template.Resources.ConnectRoute.Properties;
  assert.deepEqual(connect?.AuthorizationType, { 'Fn::If': ['UseJwt', 'CUSTOM', 'AWS_IAM'] });
  assert.deepEqual(connect?.AuthorizerId, { 'Fn::If': ['UseJwt', { Ref: 'WebSocketAuthorizer' }, { Ref: 'AWS::NoValue' }] });
  // Its role: its own log group (and X-Ray when tracing), nothing else.
  const statements = (
    template.Resources.AuthorizerRole.Properties?.Policies as Array<{ PolicyDocument: { Statement: Array<Record<string, unknown>> } }>
  )[0].PolicyDocument.Statement;
  assert.deepEqual(
    statements.map((s) => s.Sid ?? JSON.stringify(s)),
    ['OwnLogGroup', JSON.stringify(statements[1])],
  );
  assert.match(JSON.stringify(statements[1]), /TracingActive/);
  const variables = (id: string) =>
    (template.Resources[id].Properties?.Environment as { Variables: Record<string, unknown> }).Variables;
  assert.deepEqual(variables('AuthorizerFunction'), {
    JWT_ISSUER: { Ref: 'JwtIssuer' },
    JWT_AUDIENCE: { Ref: 'JwtAudience' },
    JWKS_URL: { Ref: 'JwksUrl' },
    ACCESS_POLICY: { Ref: 'AccessPolicy' },
  });
  for (const id of ['CoordinatorFunction', 'ConnectionsFunction', 'StreamProcessorFunction']) {
    assert.deepEqual(variables(id).ACCESS_POLICY, { Ref: 'AccessPolicy' }, id);
  }
  assert.deepEqual(variables('ConnectionsFunction').MAX_CONNECTIONS_PER_PRINCIPAL, { Ref: 'MaxConnectionsPerPrincipal' });
  assert.equal(template.Resources.AuthorizerFunction.Metadata?.[BINARY_METADATA], 'authorizer');
  // The alarm status widget names no alarm that may not exist.
  assert.ok(!JSON.stringify(template.Resources.Dashboard.Properties?.DashboardBody).includes('AuthorizerErrorsAlarm'));
});

test('subscribe and unsubscribe answer the client, $connect and $disconnect do not', () => {
  const routes = ofType(template, 'AWS::ApiGatewayV2::Route');
  const responses = ofType(template, 'AWS::ApiGatewayV2::RouteResponse');
  assert.equal(routes.length, 4);
  assert.equal(responses.length, 2);
  const stageDependsOn = (template.Resources.WebSocketStage as { DependsOn?: string[] }).DependsOn ?? [];
  for (const [id, route] of routes) {
    const key = route.Properties?.RouteKey as string;
    const twoWay = key === 'subscribe' || key === 'unsubscribe';
    assert.equal(route.Properties?.RouteResponseSelectionExpression, twoWay ? '$default' : undefined, id);
    const own = responses.filter(([, r]) => JSON.stringify(r.Properties?.RouteId) === JSON.stringify({ Ref: id }));
    assert.equal(own.length, twoWay ? 1 : 0, id);
    for (const [responseId, response] of own) {
      assert.equal(response.Properties?.RouteResponseKey, '$default', responseId);
      assert.ok(stageDependsOn.includes(responseId), `the stage is not created after ${responseId}`);
    }
  }
});

test('the fan-out retries until the stream drops a record, then the queue its replay reads', () => {
  const mappings = ofType(template, 'AWS::Lambda::EventSourceMapping').filter(
    ([, m]) => (m.Properties?.FunctionName as { Ref: string }).Ref === 'StreamProcessorFunction',
  );
  // The transactions table and the four participant tables.
  assert.equal(mappings.length, 5);
  for (const [id, mapping] of mappings) {
    assert.equal(mapping.Properties?.StartingPosition, 'TRIM_HORIZON', id);
    assert.equal(mapping.Properties?.MaximumRetryAttempts, -1, id);
    assert.equal(mapping.Properties?.MaximumRecordAgeInSeconds, 79200, id);
    assert.equal(mapping.Properties?.BisectBatchOnFunctionError, true, id);
  }
  const variables = (id: string) =>
    (template.Resources[id].Properties?.Environment as { Variables: Record<string, unknown> }).Variables;
  assert.deepEqual(variables('StreamProcessorFunction').DEAD_LETTER_QUEUE_URL, { Ref: 'StreamFailureQueue' });
  assert.deepEqual(variables('ConnectionsFunction').MAX_TOPICS_PER_CONNECTION, { Ref: 'MaxTopicsPerConnection' });
});

test('outcome events: the bus, the outcomes function on the transactions stream from LATEST, PutEvents on the bus only, the history', () => {
  const resource = (id: string) => template.Resources[id] as { Type: string; Properties?: Record<string, unknown> };
  // One bus, named after the stack, with no resource policy (operators only).
  const buses = ofType(template, 'AWS::Events::EventBus');
  assert.deepEqual(
    buses.map(([id]) => id),
    ['OutcomesEventBus'],
  );
  assert.deepEqual(resource('OutcomesEventBus').Properties?.Name, { 'Fn::Join': ['', [{ Ref: 'AWS::StackName' }, '-outcomes']] });
  assert.equal(resource('OutcomesEventBus').Properties?.Policy, undefined);
  assert.deepEqual(ofType(template, 'AWS::Events::EventBusPolicy'), []);
  // The outcomes function's one mapping: the transactions table's stream, from LATEST, bounded, its own queue.
  const outcomesMappings = ofType(template, 'AWS::Lambda::EventSourceMapping').filter(
    ([, m]) => (m.Properties?.FunctionName as { Ref: string }).Ref === 'OutcomesFunction',
  );
  assert.deepEqual(
    outcomesMappings.map(([id]) => id),
    ['OutcomesFunctionTransactionsStream'],
  );
  const mapping = outcomesMappings[0][1].Properties ?? {};
  assert.deepEqual(mapping.EventSourceArn, { 'Fn::GetAtt': ['TransactionsTable', 'StreamArn'] });
  assert.equal(mapping.StartingPosition, 'LATEST');
  assert.deepEqual(mapping.FunctionResponseTypes, ['ReportBatchItemFailures']);
  assert.equal(mapping.BisectBatchOnFunctionError, true);
  assert.equal(mapping.MaximumRetryAttempts, 10000);
  assert.equal(mapping.MaximumRecordAgeInSeconds, 79200);
  assert.deepEqual(mapping.DestinationConfig, {
    OnFailure: { Destination: { 'Fn::GetAtt': ['OutcomesFailureQueue', 'Arn'] } },
  });
  assert.equal(resource('OutcomesFailureQueue').Properties?.KmsMasterKeyId, 'alias/aws/sqs');
  // Its environment: the transactions table and the bus's name; the sweeper's: the bus and its parameter.
  const variables = (id: string) =>
    (template.Resources[id].Properties?.Environment as { Variables: Record<string, unknown> }).Variables;
  assert.deepEqual(variables('OutcomesFunction'), {
    TRANSACTIONS_TABLE_NAME: { Ref: 'TransactionsTable' },
    EVENT_BUS_NAME: { Ref: 'OutcomesEventBus' },
  });
  assert.deepEqual(variables('SweeperFunction').EVENT_BUS_NAME, { Ref: 'OutcomesEventBus' });
  assert.deepEqual(variables('SweeperFunction').OPEN_ALERT_AFTER_MS, { Ref: 'OpenAlertAfterMs' });
  assert.deepEqual(template.Parameters.OpenAlertAfterMs, {
    Type: 'Number',
    Default: 900000,
    MinValue: 60000,
    Description: (template.Parameters.OpenAlertAfterMs as { Description: string }).Description,
  });
  // PutEvents: the outcomes function's and the sweeper's roles, on the bus's ARN only; no other role.
  const putters: string[] = [];
  for (const [id, role] of ofType(template, 'AWS::IAM::Role')) {
    const policies = (role.Properties?.Policies ?? []) as Array<{ PolicyDocument: { Statement: unknown[] } }>;
    for (const statement of policies.flatMap((p) => p.PolicyDocument.Statement)) {
      const s = statement as { Action?: unknown; Resource?: unknown };
      const actions = ([] as unknown[]).concat(s.Action ?? []);
      if (actions.some((a) => String(a).startsWith('events:'))) {
        assert.deepEqual(actions, ['events:PutEvents'], id);
        assert.deepEqual(s.Resource, { 'Fn::GetAtt': ['OutcomesEventBus', 'Arn'] }, id);
        putters.push(id);
      }
    }
  }
  assert.deepEqual(putters.sort(), ['OutcomesRole', 'SweeperRole']);
  // The stack's one rule on the bus: the operators' outcome history, the terminal outcomes into a log
  // group of its own that EventBridge may write for this rule only and the coordinator reads back.
  const onTheBus = ofType(template, 'AWS::Events::Rule').filter(
    ([, r]) => JSON.stringify(r.Properties?.EventBusName) === JSON.stringify({ Ref: 'OutcomesEventBus' }),
  );
  assert.deepEqual(
    onTheBus.map(([id]) => id),
    ['OutcomeHistoryRule'],
  );
  assert.deepEqual(onTheBus[0][1].Properties?.EventPattern, {
    source: ['twopc'],
    'detail-type': ['Transaction Committed', 'Transaction Aborted'],
  });
  assert.deepEqual(
    ofType(template, 'AWS::Logs::ResourcePolicy').map(([id]) => id),
    ['OutcomeHistoryLogPolicy'],
  );
  assert.deepEqual(variables('CoordinatorFunction').OUTCOME_LOG_GROUP, { Ref: 'OutcomeHistoryLogGroup' });
  // Its alarms, with the stream processor's.
  for (const id of ['OutcomesFailuresAlarm', 'OutcomesErrorsAlarm', 'OutcomesThrottlesAlarm', 'OutcomesIteratorAgeAlarm']) {
    assert.equal(resource(id)?.Type, 'AWS::CloudWatch::Alarm', id);
  }
});

test('the stream processor writes its metrics where the alarms read them', () => {
  const variables = (id: string) =>
    (template.Resources[id].Properties?.Environment as { Variables: Record<string, unknown> }).Variables;
  const namespace = variables('CoordinatorFunction').METRICS_NAMESPACE;
  assert.deepEqual(variables('StreamProcessorFunction').METRICS_NAMESPACE, namespace);
  for (const [id, metric, statistic] of [
    ['ClockSkewAlarm', 'ClockSkew', 'Maximum'],
    ['UnprocessableRecordsAlarm', 'UnprocessableRecords', 'Sum'],
  ]) {
    const alarm = template.Resources[id];
    assert.ok(alarm, `no ${id}`);
    assert.equal(alarm.Properties?.MetricName, metric, id);
    assert.equal(alarm.Properties?.Statistic, statistic, id);
    assert.deepEqual(alarm.Properties?.Namespace, namespace, id);
  }
});

test('an auditor\'s deployment: the alarm topic, access logs, the lake\'s audit trail, the WAF, narrower record writes', () => {
  const resource = (id: string) => {
    const r = template.Resources[id] as { Type: string; Condition?: string; Properties?: Record<string, unknown> };
    assert.ok(r, `no ${id}`);
    return r;
  };
  // The stack's own encrypted topic, only when no AlarmActionArn is given; every alarm notifies the one chosen.
  assert.equal(resource('AlarmTopic').Condition, 'CreateAlarmTopic');
  assert.deepEqual(resource('AlarmTopic').Properties?.KmsMasterKeyId, { Ref: 'AlarmTopicKey' });
  for (const [id, alarm] of ofType(template, 'AWS::CloudWatch::Alarm')) {
    assert.deepEqual(
      alarm.Properties?.AlarmActions,
      [{ 'Fn::If': ['CreateAlarmTopic', { Ref: 'AlarmTopic' }, { Ref: 'AlarmActionArn' }] }],
      id,
    );
  }
  // Access logs on both stages, into log groups of their own.
  const rest = resource('RestApiStage').Properties?.AccessLogSetting as Record<string, unknown>;
  assert.deepEqual(rest.DestinationArn, { 'Fn::GetAtt': ['RestApiAccessLogGroup', 'Arn'] });
  const ws = resource('WebSocketStage').Properties?.AccessLogSettings as Record<string, unknown>;
  assert.deepEqual(ws.DestinationArn, { 'Fn::GetAtt': ['WebSocketAccessLogGroup', 'Arn'] });
  assert.equal(resource('ApiGatewayAccount').Condition, 'CreateApiGatewayAccount');
  // The lake: versioned; its access logged; the WAF only when enabled.
  assert.deepEqual(resource('LakeBucket').Properties?.VersioningConfiguration, { Status: 'Enabled' });
  assert.equal(resource('LakeDataEventsTrail').Condition, 'LakeCloudTrail');
  for (const id of ['RestApiWebAcl', 'RestApiWebAclAssociation', 'RestApiWebAclLogging']) {
    assert.equal(resource(id).Condition, 'UseWaf', id);
  }
  // The sweeper writes records under a condition refusing the coordinator's own attributes.
  const statements = (
    (resource('SweeperRole').Properties?.Policies as Array<{ PolicyDocument: { Statement: Array<Record<string, unknown>> } }>)[0]
      .PolicyDocument.Statement
  ).filter((s) => s.Sid === 'RecoverTransactionRecords');
  assert.equal(statements.length, 1);
  assert.deepEqual(statements[0].Condition, {
    'ForAllValues:StringNotEquals': { 'dynamodb:Attributes': ['principal', 'requestHash', 'executionId', 'holdMs', 'holdUntil', 'startedAt', 'attempt', 'firstTransactionId', 'retriedAs', 'refusedForContention', 'ageClaimedBy', 'ageOf', 'bodyHash', 'audit'] },
  });
});

test('participants: a message key each, read by the coordinator, the sweeper and their own participant only', () => {
  const variables = (id: string) =>
    (template.Resources[id].Properties?.Environment as { Variables: Record<string, unknown> }).Variables;
  // The templates never name the local stack's fixed development keys.
  assert.ok(!JSON.stringify(template).includes('local-development-keys'));
  const secrets = ofType(template, 'AWS::SecretsManager::Secret');
  assert.deepEqual(secrets.map(([id]) => id).sort(), [
    'CoordinatorAgeTokenKey',
    'ServiceAMessageKey',
    'ServiceBMessageKey',
    'ServiceInventoryMessageKey',
    'ServicePaymentsMessageKey',
  ]);
  for (const [id, secret] of secrets) {
    assert.deepEqual(
      secret.Properties?.GenerateSecretString,
      { SecretStringTemplate: '{"id":"k1"}', GenerateStringKey: 'secret', PasswordLength: 64, ExcludePunctuation: true },
      id,
    );
    // The AWS-managed key: no KMS grant in any role.
    assert.equal(secret.Properties?.KmsKeyId, undefined, id);
    assert.match(JSON.stringify(secret.Properties?.Description), /notBefore/, id);
  }
  const keys = ['A', 'B', 'Inventory', 'Payments'];
  for (const key of keys) {
    assert.deepEqual(variables(`Participant${key}Function`).PARTICIPANT_KEY, { Ref: `Service${key}MessageKey` });
    const statements = JSON.stringify(template.Resources[`Participant${key}Role`].Properties);
    assert.ok(statements.includes(`"Service${key}MessageKey"`), `Participant${key}Role`);
    for (const other of keys.filter((k) => k !== key)) {
      assert.ok(!statements.includes(`"Service${other}MessageKey"`), `Participant${key}Role reads another key`);
    }
  }
  for (const id of ['CoordinatorFunction', 'SweeperFunction']) {
    const [text, named] = (variables(id).PARTICIPANT_KEYS as { 'Fn::Sub': [string, Record<string, unknown>] })['Fn::Sub'];
    assert.equal(
      text,
      '{"${ServiceAName}": "${ServiceA}", "${ServiceBName}": "${ServiceB}", "inventory": "${ServiceInventory}", ' +
        '"payments": "${ServicePayments}"}',
      id,
    );
    assert.deepEqual(
      named,
      {
        ServiceA: { Ref: 'ServiceAMessageKey' },
        ServiceB: { Ref: 'ServiceBMessageKey' },
        ServiceInventory: { Ref: 'ServiceInventoryMessageKey' },
        ServicePayments: { Ref: 'ServicePaymentsMessageKey' },
      },
      id,
    );
  }
  const permissions = ofType(template, 'AWS::Lambda::Permission').filter(([id]) => id.startsWith('Participant'));
  assert.deepEqual(
    permissions.map(([, p]) => JSON.stringify([p.Properties?.FunctionName, p.Properties?.Principal])).sort(),
    keys
      .flatMap((key) =>
        ['CoordinatorRole', 'SweeperRole'].map((role) =>
          JSON.stringify([{ Ref: `Participant${key}FunctionAliaslive` }, { 'Fn::GetAtt': [role, 'Arn'] }]),
        ),
      )
      .sort(),
  );
});

test('the coordinator signs age tokens with a key of its own, which no other role may read', () => {
  const variables = (id: string) =>
    (template.Resources[id].Properties?.Environment as { Variables: Record<string, unknown> }).Variables;
  assert.deepEqual(variables('CoordinatorFunction').AGE_TOKEN_KEY, { Ref: 'CoordinatorAgeTokenKey' });
  const readers = ofType(template, 'AWS::IAM::Role')
    .filter(([, role]) => JSON.stringify(role.Properties).includes('"CoordinatorAgeTokenKey"'))
    .map(([id]) => id);
  assert.deepEqual(readers, ['CoordinatorRole']);
  for (const [id, fn] of ofType(template, 'AWS::Lambda::Function')) {
    if (id !== 'CoordinatorFunction') {
      assert.ok(!JSON.stringify(fn.Properties).includes('AGE_TOKEN_KEY'), id);
    }
  }
});

test('one more service is one more participant deployment', () => {
  const three = synth([
    ...SERVICES,
    { key: 'C', defaultName: 'service-c', defaultTableName: 'service-c-data', ordinal: 'third' },
  ]);
  for (const id of [
    'ServiceCTable',
    'ParticipantCFunction',
    'ParticipantCRole',
    'ParticipantCLogGroup',
    'ParticipantCFunctionAliaslive',
    'StreamProcessorFunctionServiceCStream',
    'ParticipantCErrorsAlarm',
    'ParticipantCThrottlesAlarm',
    'ServiceCTableThrottlesAlarm',
    'ServiceCMessageKey',
    'ParticipantCInvokeByCoordinator',
    'ParticipantCInvokeBySweeper',
  ]) {
    assert.ok(three.Resources[id], `no ${id}`);
  }
  for (const name of ['ServiceCName', 'ServiceCTableName']) assert.ok(three.Parameters[name], `no parameter ${name}`);
  for (const name of ['ServiceCTableName', 'ParticipantCFunctionName', 'ParticipantCLiveAlias', 'ServiceCMessageKeyArn']) {
    assert.ok(three.Outputs[name], `no output ${name}`);
  }
  const coordinatorEnv = (three.Resources.CoordinatorFunction.Properties?.Environment as { Variables: Record<string, unknown> })
    .Variables;
  const [text, variables] = (coordinatorEnv.PARTICIPANTS as { 'Fn::Sub': [string, Record<string, unknown>] })['Fn::Sub'];
  assert.equal(
    text,
    '{"${ServiceAName}": "${ServiceA}", "${ServiceBName}": "${ServiceB}", "inventory": "${ServiceInventory}", ' +
      '"payments": "${ServicePayments}", "${ServiceCName}": "${ServiceC}"}',
  );
  assert.deepEqual(variables.ServiceC, { Ref: 'ParticipantCFunctionAliaslive' });
  const [keysText, keys] = (coordinatorEnv.PARTICIPANT_KEYS as { 'Fn::Sub': [string, Record<string, unknown>] })['Fn::Sub'];
  assert.equal(keysText, text);
  assert.deepEqual(keys.ServiceC, { Ref: 'ServiceCMessageKey' });
  const participantEnv = (three.Resources.ParticipantCFunction.Properties?.Environment as { Variables: Record<string, unknown> })
    .Variables;
  assert.deepEqual(participantEnv.PARTICIPANT_KEY, { Ref: 'ServiceCMessageKey' });
  const sweeperPolicy = JSON.stringify(three.Resources.SweeperRole.Properties);
  assert.match(sweeperPolicy, /ServiceCTable.*\/index\/locks-by-expiry/);
  assert.match(sweeperPolicy, /ParticipantCFunctionAliaslive/);
  assert.match(sweeperPolicy, /ServiceCMessageKey/);
  assert.match(JSON.stringify(three.Resources.CoordinatorRole.Properties), /ServiceCMessageKey/);
  assert.match(JSON.stringify(three.Resources.ParticipantCRole.Properties), /ServiceCMessageKey/);
});

test('the inventory: a participant deployment of its own binary, its name fixed, its table named as the others', () => {
  const variables = (id: string) =>
    (template.Resources[id].Properties?.Environment as { Variables: Record<string, unknown> }).Variables;
  for (const id of [
    'ServiceInventoryTable',
    'ServiceInventoryMessageKey',
    'ParticipantInventoryFunction',
    'ParticipantInventoryRole',
    'ParticipantInventoryLogGroup',
    'ParticipantInventoryFunctionAliaslive',
    'ParticipantInventoryInvokeByCoordinator',
    'ParticipantInventoryInvokeBySweeper',
    'StreamProcessorFunctionServiceInventoryStream',
    'ParticipantInventoryErrorsAlarm',
    'ParticipantInventoryThrottlesAlarm',
    'ServiceInventoryTableThrottlesAlarm',
  ]) {
    assert.ok(template.Resources[id], `no ${id}`);
  }
  // Its name is not a parameter (its operation schemas are keyed by it); its table's is.
  assert.equal(template.Parameters.ServiceInventoryName, undefined);
  assert.deepEqual((template.Parameters.ServiceInventoryTableName as { Default: string }).Default, 'inventory-data');
  assert.deepEqual(variables('ParticipantInventoryFunction'), {
    SERVICE_NAME: 'inventory',
    DATA_TABLE_NAME: { Ref: 'ServiceInventoryTable' },
    TRANSACTIONS_TABLE_NAME: { Ref: 'TransactionsTable' },
    PARTICIPANT_KEY: { Ref: 'ServiceInventoryMessageKey' },
    PENDING_CREDITS: { Ref: 'PendingCredits' },
  });
  // Each function names the binary it runs: the inventory its own, the other participants the generic one.
  const binary = (id: string) => template.Resources[id].Metadata?.[BINARY_METADATA];
  assert.equal(binary('ParticipantInventoryFunction'), 'inventory');
  assert.equal(binary('ParticipantAFunction'), 'participant');
  assert.equal(binary('CoordinatorFunction'), 'coordinator');
  for (const id of ['SweeperFunction', 'StreamProcessorFunction']) {
    const tables = variables(id).PARTICIPANT_TABLES as { 'Fn::Sub': [string, Record<string, unknown>] };
    assert.match(tables['Fn::Sub'][0], /"inventory": "\$\{ServiceInventory\}"/, id);
    assert.deepEqual(tables['Fn::Sub'][1].ServiceInventory, { Ref: 'ServiceInventoryTable' }, id);
  }
});

test('the payments: a resource participant of its own binary, its payment API a parameter, its role on its barrier only', () => {
  const variables = (id: string) =>
    (template.Resources[id].Properties?.Environment as { Variables: Record<string, unknown> }).Variables;
  for (const id of [
    'ServicePaymentsTable',
    'ServicePaymentsMessageKey',
    'ParticipantPaymentsFunction',
    'ParticipantPaymentsRole',
    'ParticipantPaymentsLogGroup',
    'ParticipantPaymentsFunctionAliaslive',
    'ParticipantPaymentsInvokeByCoordinator',
    'ParticipantPaymentsInvokeBySweeper',
    'StreamProcessorFunctionServicePaymentsStream',
    'ParticipantPaymentsErrorsAlarm',
    'ParticipantPaymentsThrottlesAlarm',
    'ServicePaymentsTableThrottlesAlarm',
  ]) {
    assert.ok(template.Resources[id], `no ${id}`);
  }
  assert.equal(template.Parameters.ServicePaymentsName, undefined);
  assert.equal((template.Parameters.ServicePaymentsTableName as { Default: string }).Default, 'payments-data');
  const url = template.Parameters.PaymentApiUrl as { Type: string; Default: string; Description: string };
  assert.equal(url.Type, 'String');
  assert.equal(url.Default, 'https://payments.example.com');
  assert.match(url.Description, /idempotency keys/);
  assert.match(url.Description, /VPC/);
  assert.deepEqual(variables('ParticipantPaymentsFunction'), {
    SERVICE_NAME: 'payments',
    DATA_TABLE_NAME: { Ref: 'ServicePaymentsTable' },
    TRANSACTIONS_TABLE_NAME: { Ref: 'TransactionsTable' },
    PARTICIPANT_KEY: { Ref: 'ServicePaymentsMessageKey' },
    PENDING_CREDITS: { Ref: 'PendingCredits' },
    PAYMENT_API_URL: { Ref: 'PaymentApiUrl' },
  });
  // PAYMENT_API_URL on the payments function only.
  for (const [id] of ofType(template, 'AWS::Lambda::Function').filter(([id]) => id !== 'ParticipantPaymentsFunction')) {
    assert.equal(variables(id).PAYMENT_API_URL, undefined, id);
  }
  assert.equal(template.Resources.ParticipantPaymentsFunction.Metadata?.[BINARY_METADATA], 'payments');
  // Longer than a prepare retrying the payment API until the latest deadline (25 s), and than the others.
  const timeout = (id: string) => template.Resources[id].Properties?.Timeout as number;
  assert.ok(timeout('ParticipantPaymentsFunction') >= 35);
  assert.ok(timeout('ParticipantPaymentsFunction') >= timeout('ParticipantAFunction'));
  // Its barrier entries (GetItem, PutItem, UpdateItem) on its own table, nothing of the transactions table.
  const role = JSON.stringify(template.Resources.ParticipantPaymentsRole.Properties);
  assert.ok(!role.includes('TransactionsTable'), 'the payments role reaches the transactions table');
  const statements = (
    template.Resources.ParticipantPaymentsRole.Properties?.Policies as Array<{
      PolicyDocument: { Statement: Array<Record<string, unknown>> };
    }>
  )[0].PolicyDocument.Statement;
  const own = statements.find((s) => s.Sid === 'OwnDataTable');
  assert.deepEqual(own?.Action, ['dynamodb:GetItem', 'dynamodb:PutItem', 'dynamodb:UpdateItem']);
  assert.deepEqual(own?.Resource, { 'Fn::GetAtt': ['ServicePaymentsTable', 'Arn'] });
  for (const id of ['SweeperFunction', 'StreamProcessorFunction']) {
    const tables = variables(id).PARTICIPANT_TABLES as { 'Fn::Sub': [string, Record<string, unknown>] };
    assert.match(tables['Fn::Sub'][0], /"payments": "\$\{ServicePayments\}"/, id);
    assert.deepEqual(tables['Fn::Sub'][1].ServicePayments, { Ref: 'ServicePaymentsTable' }, id);
  }
  // The alarm an operator sees for a confirm that fails for good says what to do.
  assert.match(String(template.Resources.StuckTransactionsAlarm.Properties?.AlarmDescription), /sweepError/);
});

test('the coordinator gets SERVICE_OPERATIONS: infra/service-operations.json, compact', () => {
  const variables = (t: ReturnType<typeof synth>) =>
    (t.Resources.CoordinatorFunction.Properties?.Environment as { Variables: Record<string, unknown> }).Variables;
  const file = readFileSync(path.join(repositoryRoot(), 'infra', 'service-operations.json'), 'utf8');
  assert.equal(variables(template).SERVICE_OPERATIONS, JSON.stringify(JSON.parse(file)));
  assert.equal(serviceOperations(), JSON.stringify(JSON.parse(file)));
  // Given explicitly, taken as it is; a file that is not a JSON object is refused, naming it.
  assert.equal(variables(synth(undefined, undefined, '{}')).SERVICE_OPERATIONS, '{}');
  const root = mkdtempSync(path.join(tmpdir(), 'twopc-cdk-root-'));
  mkdirSync(path.join(root, 'infra'));
  writeFileSync(path.join(root, 'infra', 'service-operations.json'), '[]');
  assert.throws(() => serviceOperations(root), /service-operations\.json is not a JSON object/);
  assert.throws(() => serviceOperations(tmpdir()), /service-operations\.json/);
});

test('code source: zips when given, a clear error when a zip is missing', () => {
  assert.deepEqual(codeSource(zips, '/'), { kind: 'zips', dir: zips });
  const incomplete = fakeZips(['sweeper']);
  assert.throws(() => codeSource(incomplete, '/'), /missing .*sweeper\/bootstrap\.zip/);
});

test('code source: without zips and without cargo-lambda, an error instead of Docker', () => {
  const saved = { path: process.env.PATH, zips: process.env.TWOPC_LAMBDA_ZIPS };
  try {
    delete process.env.TWOPC_LAMBDA_ZIPS;
    process.env.PATH = mkdtempSync(path.join(tmpdir(), 'twopc-cdk-empty-path-'));
    assert.throws(() => codeSource(undefined, '/'), /cargo-lambda is not installed.*never builds in Docker/s);
  } finally {
    process.env.PATH = saved.path;
    if (saved.zips !== undefined) process.env.TWOPC_LAMBDA_ZIPS = saved.zips;
  }
});

test('code source: TWOPC_LAMBDA_ZIPS when no context value is given', () => {
  const saved = process.env.TWOPC_LAMBDA_ZIPS;
  try {
    process.env.TWOPC_LAMBDA_ZIPS = zips;
    assert.deepEqual(codeSource(undefined, '/'), { kind: 'zips', dir: zips });
  } finally {
    if (saved === undefined) delete process.env.TWOPC_LAMBDA_ZIPS;
    else process.env.TWOPC_LAMBDA_ZIPS = saved;
  }
});
