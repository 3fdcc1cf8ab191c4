#!/usr/bin/env node
// The CDK app: one stack, `TwoPhaseCommit`, the same system as infra/template.yaml (SAM).
//
//   npx cdk synth                               # builds every function with cargo-lambda (RustFunction)
//   npx cdk synth -c lambdaZips=target/lambda   # takes infra/build.sh's zips instead (no build)
//   npx cdk synth -c cargoProfile=dev           # RustFunction with the dev profile (quick, not for production)
//   npx cdk deploy -c stackName=my-2pc ...      # another CloudFormation stack name (default TwoPhaseCommit)
//
// infra/cdk/synth.sh is the offline synthesis CI runs. See infra/DEPLOY.md, "CDK".

import { App, DefaultStackSynthesizer } from 'aws-cdk-lib';

import { codeSource } from '../lib/code';
import { TwoPhaseCommitStack } from '../lib/stack';

const app = new App();

const stackName = app.node.tryGetContext('stackName') as string | undefined;

new TwoPhaseCommitStack(app, 'TwoPhaseCommit', {
  stackName: stackName || undefined,
  description:
    'Serverless two-phase commit across services on AWS Lambda and DynamoDB (CDK app infra/cdk; ' +
    'the same system as the SAM template infra/template.yaml).',
  code: codeSource(
    app.node.tryGetContext('lambdaZips') as string | undefined,
    undefined,
    (app.node.tryGetContext('cargoProfile') as string | undefined) || 'release',
  ),
  // No environment (account/region): the template is environment-agnostic, like the SAM one, and
  // synthesis never looks anything up in an account.
  synthesizer: new DefaultStackSynthesizer({
    // A real deploy uploads the function zips to the CDK bootstrap bucket (`cdk bootstrap` once per
    // account and region); the template itself carries no check of the bootstrap version, so it
    // can be synthesized and linted without an account.
    generateBootstrapVersionRule: false,
  }),
  analyticsReporting: false,
});

app.synth();
