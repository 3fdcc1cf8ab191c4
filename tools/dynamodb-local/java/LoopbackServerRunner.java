// Starts DynamoDB Local like its own ServerRunner, but listening on 127.0.0.1 only.
//
// DynamoDB Local has no option for the listen address: DynamoDBProxyServer builds a Jetty
// `new Server(port)`, whose connector binds every interface. This launcher builds the server
// through the public `ServerRunner.createServerFromCommandLineArgs`, sets the host of the
// (not yet started) Jetty connector, then starts it. Telemetry is never configured, so none is
// sent. Compiled once at install time by the dynamodb-local crate (src/lib.rs); the crate falls
// back to the stock ServerRunner (all interfaces) when no `javac` is available.
import java.lang.reflect.Field;
import org.eclipse.jetty.server.Connector;
import org.eclipse.jetty.server.NetworkConnector;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;
import software.amazon.dynamodb.services.local.main.ServerRunner;
import software.amazon.dynamodb.services.local.server.DynamoDBProxyServer;

public final class LoopbackServerRunner {
    public static void main(String[] args) throws Exception {
        String host = System.getProperty("dynamodb.local.host", "127.0.0.1");
        DynamoDBProxyServer proxy = ServerRunner.createServerFromCommandLineArgs(args);
        Field field = DynamoDBProxyServer.class.getDeclaredField("server");
        field.setAccessible(true);
        Server server = (Server) field.get(proxy);
        int connectors = 0;
        for (Connector connector : server.getConnectors()) {
            if (connector instanceof ServerConnector) {
                ((ServerConnector) connector).setHost(host);
                connectors++;
            }
        }
        if (connectors == 0) {
            System.err.println("LoopbackServerRunner: no Jetty ServerConnector to restrict to " + host);
            System.exit(2);
        }
        // Prints "Could not start server on port N: ..." and stops the server if the bind fails.
        proxy.start();
        if (!server.isStarted()) {
            System.exit(1);
        }
        for (Connector connector : server.getConnectors()) {
            if (connector instanceof NetworkConnector) {
                NetworkConnector network = (NetworkConnector) connector;
                System.out.println("DynamoDB Local listening on " + network.getHost() + ":" + network.getLocalPort());
            }
        }
    }
}
