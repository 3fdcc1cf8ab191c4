// Where the functions' code comes from: cargo-lambda-cdk's RustFunction (builds each binary with
// `cargo lambda build --release --arm64`), or the zips that infra/build.sh made (no build, no Docker,
// no network: what CI and infra/cdk/synth.sh use).
//
//   -c lambdaZips=<dir>   or   TWOPC_LAMBDA_ZIPS=<dir>
//
// take <dir>/<binary>/bootstrap.zip for every function: `target/lambda` (infra/build.sh) or
// `target/lambda-debug` (infra/build.sh --quick). A relative <dir> is taken from the repository
// root. Without either, cargo-lambda must be installed: RustFunction would otherwise fall back to
// building in a Docker container, which this app never does. RustFunction builds the release
// profile (the root Cargo.toml's size-tuned one); `-c cargoProfile=dev` builds the dev profile
// instead (a quick build, sharing target/ with `infra/build.sh --quick`; not for production).

import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import * as path from 'node:path';

import * as lambda from 'aws-cdk-lib/aws-lambda';
import { RustFunction } from 'cargo-lambda-cdk';
import { Construct } from 'constructs';

/** The workspace's Lambda binaries (functions/<binary>, each a package of the same name); `inventory` is
 * the example service with its own participant (the participant library with its own operations),
 * `payments` the example resource participant (the participant library driving a payment API),
 * `outcomes` the transactions stream's second reader (one EventBridge event per outcome),
 * `authorizer` the JWT authorizer of both APIs (deployed only when JwtIssuer is set, its zip needed
 * all the same). */
export const BINARIES = [
  'coordinator',
  'participant',
  'inventory',
  'payments',
  'sweeper',
  'stream-processor',
  'outcomes',
  'connections',
  'authorizer',
] as const;
export type Binary = (typeof BINARIES)[number];

export type CodeSource =
  | { readonly kind: 'zips'; readonly dir: string }
  | {
      readonly kind: 'cargo-lambda';
      readonly manifestPath: string;
      /** The Cargo profile cargo-lambda builds with (`release` unless told otherwise). */
      readonly profile: string;
    };

/** The repository root: the nearest directory above this file whose Cargo.toml is a workspace. */
export function repositoryRoot(from: string = __dirname): string {
  let dir = path.resolve(from);
  for (;;) {
    const manifest = path.join(dir, 'Cargo.toml');
    if (existsSync(manifest) && /^\s*\[workspace\]/m.test(readFileSync(manifest, 'utf8'))) {
      return dir;
    }
    const parent = path.dirname(dir);
    if (parent === dir) {
      throw new Error(`no Cargo workspace (Cargo.toml with [workspace]) above ${from}`);
    }
    dir = parent;
  }
}

function cargoLambdaInstalled(): boolean {
  const result = spawnSync('cargo', ['lambda', '--version'], { stdio: 'ignore' });
  return result.error === undefined && result.status === 0;
}

/**
 * The code source for this synthesis: the zips directory (context `lambdaZips`, else the
 * environment variable TWOPC_LAMBDA_ZIPS), else cargo-lambda. Fails, naming both ways out, when
 * neither is available, and when a zip is missing.
 */
export function codeSource(
  zipsSetting: string | undefined,
  root: string = repositoryRoot(),
  cargoProfile: string = 'release',
): CodeSource {
  const setting = zipsSetting?.trim() || process.env.TWOPC_LAMBDA_ZIPS?.trim();
  if (setting) {
    const dir = path.resolve(root, setting);
    const missing = BINARIES.map((b) => path.join(dir, b, 'bootstrap.zip')).filter((zip) => !existsSync(zip));
    if (missing.length > 0) {
      throw new Error(
        `lambdaZips=${setting}: missing ${missing.map((m) => path.relative(root, m)).join(', ')}. ` +
          'Build them with `bash infra/build.sh` (target/lambda) or `bash infra/build.sh --quick` (target/lambda-debug).',
      );
    }
    return { kind: 'zips', dir };
  }
  if (!cargoLambdaInstalled()) {
    throw new Error(
      'cargo-lambda is not installed, and no Lambda zips were given. Either install it ' +
        '(`pip install cargo-lambda ziglang`, `rustup target add aarch64-unknown-linux-gnu`; infra/build.sh does both) ' +
        'so that RustFunction builds the functions, or build the zips with `bash infra/build.sh [--quick]` and pass ' +
        '`-c lambdaZips=target/lambda` (or target/lambda-debug; or set TWOPC_LAMBDA_ZIPS). ' +
        'This app never builds in Docker.',
    );
  }
  return { kind: 'cargo-lambda', manifestPath: path.join(root, 'Cargo.toml'), profile: cargoProfile };
}

/** Everything of a function except its code, runtime, architecture and handler (fixed here). */
export type RustFunctionOptions = Omit<lambda.FunctionOptions, 'architecture'>;

/**
 * The function resource's metadata entry naming the binary it runs. The template names its code by
 * asset hash only, and two binaries may read the same environment (the generic participant and a
 * service's own participant): infra/tests tells them apart by this entry (SAM: the build metadata's
 * Binary), and holds it to the staged code (infra/tests/test_cdk_code.py).
 */
export const BINARY_METADATA = 'twopc:binary';

/** A function running `binary` on provided.al2023, arm64, from the given code source. */
export function rustFunction(
  scope: Construct,
  id: string,
  source: CodeSource,
  binary: Binary,
  options: RustFunctionOptions,
): lambda.Function {
  const f = newRustFunction(scope, id, source, binary, options);
  (f.node.defaultChild as lambda.CfnFunction).addMetadata(BINARY_METADATA, binary);
  return f;
}

function newRustFunction(
  scope: Construct,
  id: string,
  source: CodeSource,
  binary: Binary,
  options: RustFunctionOptions,
): lambda.Function {
  const architecture = lambda.Architecture.ARM_64;
  if (source.kind === 'zips') {
    return new lambda.Function(scope, id, {
      ...options,
      architecture,
      runtime: lambda.Runtime.PROVIDED_AL2023,
      handler: 'bootstrap',
      code: lambda.Code.fromAsset(path.join(source.dir, binary, 'bootstrap.zip')),
    });
  }
  return new RustFunction(scope, id, {
    ...options,
    architecture,
    runtime: 'provided.al2023',
    manifestPath: source.manifestPath,
    binaryName: binary,
    bundling: {
      architecture,
      profile: source.profile,
      // cargo-lambda is installed (checked above): the build runs here, never in a container.
      forcedDockerBundling: false,
    },
  });
}
